//! Captured `tracing` output, for tests that check what is (and is not) logged.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A `Write` that appends to a shared buffer: the captured log.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A subscriber that writes every event up to `level` into this buffer, without colours.
    ///
    /// Install it with `with_default` or `set_default` on the thread whose events it captures.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        // tracing caches one interest per callsite for the whole process, computed by the
        // first thread that reaches it. While exactly one dispatcher is registered
        // (tracing-core 0.1.36, `Rebuilder::JustOne`), that interest is asked of the
        // *registering thread's* default, not of the registered dispatcher: a sibling test
        // on a thread without a subscriber reaching a callsite first caches `never` for it,
        // and this capture, the one dispatcher, sees nothing from that callsite again
        // (tokio-rs/tracing#3611). It emptied `redis_security`'s captured log once in a
        // loaded run. A second dispatcher that lives as long as the process sends every
        // registration down the general path, which asks each live dispatcher, this one
        // included.
        static SECOND_DISPATCHER: OnceLock<tracing::Dispatch> = OnceLock::new();
        SECOND_DISPATCHER
            .get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish()
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}
