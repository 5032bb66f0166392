//! `tenure install DIR`: a copy of this executable put in place in one rename, for an init
//! container that injects tenure into another image.

use crate::error::CliError;

/// `tenure install DIR`: copies this executable to `DIR/tenure`.
///
/// The copy is written to a new temporary file in DIR (`O_EXCL` and `O_NOFOLLOW`: never
/// through a link someone placed there), made executable, synced, and renamed over
/// `DIR/tenure`. A rename replaces a symbolic link itself, never its target, and whoever runs
/// `DIR/tenure` meanwhile gets the old file or the whole new one.
pub fn install(dir: &std::path::Path) -> Result<u8, CliError> {
    use std::fs::{File, OpenOptions, Permissions};
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, e: std::io::Error| CliError::Config {
        message: format!("install into {}: {what}: {e}", dir.display()),
    };
    let me = std::env::current_exe().map_err(|e| fail("cannot find this executable", e))?;
    let target = dir.join("tenure");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let temp = dir.join(format!(".tenure.{}.{nanos}.tmp", std::process::id()));
    let written = (|| {
        let mut source = File::open(&me).map_err(|e| fail("cannot read this executable", e))?;
        let mut copy = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(|e| fail("cannot create a temporary file", e))?;
        std::io::copy(&mut source, &mut copy).map_err(|e| fail("cannot copy", e))?;
        // Not subject to the umask, unlike the mode given at creation.
        copy.set_permissions(Permissions::from_mode(0o755))
            .map_err(|e| fail("cannot make it executable", e))?;
        copy.sync_all()
            .map_err(|e| fail("cannot sync the copy", e))?;
        drop(copy);
        std::fs::rename(&temp, &target).map_err(|e| fail("cannot move the copy into place", e))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    // The rename itself survives a crash once the directory is synced; best effort.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    println!("{}", target.display());
    Ok(0)
}
