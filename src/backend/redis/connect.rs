//! Connection set-up: [`RedisBackend::connect`] turns a [`RedisConfig`] into the command
//! connection (a single server's, or a cluster's), the engine with every
//! script loaded, the coalescers in front of it and the subscriber hub.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::batch::Coalescer;
use super::cluster::Cluster;
use super::config::RedisConfig;
use super::conn::Conn;
use super::engine::{self, Engine};
use super::error::{config_error, from_conn, from_redis};
use super::observe::Hub;
use super::server::{Connector, Managed};
use super::{Inner, RedisBackend, completion, expiry, group, keys, members};
use crate::backend::BackendError;
#[cfg(doc)]
use crate::backend::BackendErrorKind;

impl RedisBackend {
    /// Connects (TLS and AUTH included) and loads the scripts.
    ///
    /// # Errors
    ///
    /// - [`BackendErrorKind::Config`] for an invalid option, or a server certificate the
    ///   configured CA does not vouch for;
    /// - [`BackendErrorKind::Unauthenticated`] if the server refuses the credentials;
    /// - [`BackendErrorKind::PermissionDenied`] if the user may not load scripts;
    /// - [`BackendErrorKind::Unavailable`] or [`BackendErrorKind::Timeout`] if the server cannot
    ///   be reached within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect(config: RedisConfig) -> Result<Self, BackendError> {
        config.validate()?;
        let scrub = config.scrubber();
        let connector = Connector::new(
            config.info.clone(),
            config.ca_pem.as_deref(),
            config.connect_timeout,
            config.request_timeout,
        )
        .map_err(|e| config_error(scrub.scrub(format!("redis TLS: {e}"))))?;
        let connecting = async {
            if config.cluster {
                Cluster::connect(connector.clone())
                    .await
                    .map(Conn::Cluster)
                    .map_err(|e| from_conn(&e, "connect", &scrub))
            } else {
                Managed::connect(connector.clone())
                    .await
                    .map(Conn::Single)
                    .map_err(|e| from_redis(&e, "connect", &scrub))
            }
        };
        let conn = tokio::time::timeout(config.connect_timeout * 2, connecting)
            .await
            .map_err(|_| BackendError::timeout("redis connect", config.connect_timeout * 2))??;
        let batches = conn.batches();
        let engine = Arc::new(Engine {
            conn,
            keys: keys::Keys::new(&config.prefix),
            scrub,
            counters: engine::Counters::default(),
            max_entries: config.max_batch,
            ack_ttl: config.release_ack_ttl,
        });
        let scripts = [
            &engine::lock_scripts()[..],
            &members::scripts()[..],
            &group::scripts()[..],
            &completion::scripts()[..],
        ]
        .concat();
        tokio::time::timeout(config.request_timeout, engine.load_scripts(&scripts))
            .await
            .map_err(|_| BackendError::timeout("redis script load", config.request_timeout))??;
        let in_flight = if config.coalesce && batches {
            1
        } else {
            usize::MAX
        };
        let shutdown = CancellationToken::new();
        let timeout = config.request_timeout;
        let e = engine.clone();
        let acquire = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.acquire(v).await })
            }),
            in_flight,
            timeout,
        );
        let e = engine.clone();
        let renew = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.renew(v).await })
            }),
            in_flight,
            timeout,
        );
        let e = engine.clone();
        let release = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.release(v).await })
            }),
            in_flight,
            timeout,
        );
        let hub = Arc::new(Hub::new(
            connector,
            shutdown.clone(),
            config.connect_timeout,
            config.request_timeout,
        ));
        tracing::debug!(url = %config.redacted_url(), "redis backend connected");
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                expiries: expiry::Expiries::default(),
                hub,
                acquire,
                renew,
                release,
                request_timeout: config.request_timeout,
                url: config.redacted_url(),
                shutdown,
            }),
        })
    }
}
