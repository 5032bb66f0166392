//! The group record in the state directory (sharded leadership): the file
//! `<dir>/groups/G/record`, holding [`GroupRecord::encode`]'s text, replaced by `rename` under
//! the group's `flock` (the lock every membership change takes), so a compare-and-swap is
//! atomic across processes. Its version is the text itself: every change of a record changes
//! its text. The member listing reads only `*.member` files, so it never sees this one.

use std::fs::{self, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::members::{ensure_group_dir, group_dir, lock_group};
use super::store::{Store, io_error, not_regular};
use crate::backend::group::MAX_GROUP_RECORD;
use crate::backend::{BackendError, GroupRead, GroupRecord, GroupVersion};

/// The record's file name in the group directory.
const RECORD_FILE: &str = "record";

/// The stored text, or `None` without a record; anything that is not a small regular file is
/// reported as damaged, never read (a FIFO would block, a huge file would be read whole).
fn read_text(path: &Path) -> Result<Result<Option<Vec<u8>>, String>, BackendError> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Err("the record file is a symbolic link".to_owned()));
        }
        Err(e) => return Err(io_error("open the group record", path, &e)),
    };
    if let Some(why) = not_regular(&file, path)? {
        return Ok(Err(format!("the record file is not a regular file: {why}")));
    }
    let mut bytes = Vec::with_capacity(MAX_GROUP_RECORD);
    file.take(MAX_GROUP_RECORD as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("read the group record", path, &e))?;
    Ok(Ok(Some(bytes)))
}

/// Reads `group`'s record.
pub(super) fn read(store: &Store, group: &str) -> Result<GroupRead, BackendError> {
    let path = group_dir(store, group).join(RECORD_FILE);
    Ok(match read_text(&path)? {
        Ok(None) => GroupRead::Absent,
        Ok(Some(bytes)) => {
            let version = GroupVersion(String::from_utf8_lossy(&bytes).into_owned());
            GroupRead::parse(&bytes, version)
        }
        Err(reason) => GroupRead::Damaged { reason },
    })
}

/// Writes `record` if the stored text is `expected` (`None`: if there is no record).
pub(super) fn swap(
    store: &Store,
    group: &str,
    expected: Option<&GroupVersion>,
    record: &GroupRecord,
    abandoned: &AtomicBool,
) -> Result<bool, BackendError> {
    let dir = ensure_group_dir(store, group)?;
    let _lock = lock_group(&dir, true, abandoned)?;
    let path = dir.join(RECORD_FILE);
    let current = match read_text(&path)? {
        Ok(current) => current,
        // Only a record tenure can read is ever swapped: a damaged one stays for a person.
        Err(_) => return Ok(false),
    };
    if current.as_deref() != expected.map(|v| v.0.as_bytes()) {
        return Ok(false);
    }
    let tmp = dir.join(format!(".record.{:016x}.tmp", crate::util::random_u64()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| io_error("create", &tmp, &e))?;
        f.write_all(record.encode().as_bytes())
            .map_err(|e| io_error("write", &tmp, &e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| io_error("replace the group record", &path, &e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}
