//! `--publish-status`: this replica's view of the election, written into the status of the
//! `Election` custom resource.

use tenure::election::LeaderElector;

use crate::args::RunArgs;
use crate::backend::Connected;
use crate::error::CliError;

/// Starts the status publisher in the background.
pub async fn spawn(
    _args: &RunArgs,
    _connected: &Connected,
    _elector: &LeaderElector,
) -> Result<(), CliError> {
    Err(CliError::Config {
        message: "--publish-status is not available yet".into(),
    })
}
