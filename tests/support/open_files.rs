//! Lowers the test process's limit on open files (`RLIMIT_NOFILE`), for the tests of what an
//! endpoint does when descriptors run short. The limit is the whole process's: a test binary
//! that lowers it holds that one test alone.

/// Lowers this process's soft limit on open files to at most `max`.
pub fn limit_open_files(max: libc::rlim_t) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) };
    assert_eq!(read, 0, "getrlimit: {}", std::io::Error::last_os_error());
    lim.rlim_cur = lim.rlim_cur.min(max);
    // SAFETY: as above.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) };
    assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());
}
