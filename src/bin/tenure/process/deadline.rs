//! A term's kill deadline in memory that tenure and the group's watchdog process share, and
//! the monotonic clock it is counted on.
//!
//! tenure writes each later deadline into the cell from the term's renewal listener, while
//! the lease's state is locked (`Term::on_renewal`): the watchdog process reads the deadline
//! tenure itself judges by, the moment it judges, however late any thread of tenure runs.
//! (Fed over a pipe by a thread instead, a deadline could be stale: under CPU load the thread
//! ran late, and the process killed commands whose terms had been renewed all along.)
//!
//! The cell is a `memfd` of three words, mapped shared by both processes and only ever touched
//! through atomics. Besides the deadline it holds the report of a kill (when, and by how
//! much the deadline had passed), written by whichever half of the watchdog kills: the
//! process is in the group it kills, so it cannot report on stderr afterwards, and must not
//! wait on a write to a pipe before.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The cell's words: the deadline, the instant of a kill (0: none), and the deadline that
/// kill judged by; all absolute `CLOCK_MONOTONIC` nanoseconds.
const WORDS: usize = 3;
const DEADLINE: usize = 0;
const KILLED_AT: usize = 1;
const KILLED_BY: usize = 2;
const SIZE: usize = WORDS * size_of::<u64>();

/// A term's deadline shared with its watchdog process.
pub struct DeadlineCell {
    words: NonNull<AtomicU64>,
    fd: OwnedFd,
}

// SAFETY: the mapping is touched only through `AtomicU64`s, which any thread may share; it
// stays mapped until `drop`, which needs the cell owned.
unsafe impl Send for DeadlineCell {}
// SAFETY: as above.
unsafe impl Sync for DeadlineCell {}

/// What a kill by the watchdog left in the cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReport {
    /// The deadline passed; the kill came this long after it.
    Late(Duration),
    /// No deadline was ever set: the term had ended before its command was guarded.
    NoDeadline,
}

impl DeadlineCell {
    /// A new cell (deadline 0: passed) in a memfd closed on exec, so that only a process it
    /// is handed to explicitly (`inherit_in_child`) sees it.
    pub fn create() -> io::Result<Self> {
        // SAFETY: memfd_create reads the NUL-terminated name we pass and returns a new fd.
        let raw =
            unsafe { libc::memfd_create(c"tenure-watchdog-deadline".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(SIZE).map_err(io::Error::other)?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd)
    }

    /// The cell behind descriptor `fd`, handed down by tenure (the watchdog process's side).
    pub fn open(fd: RawFd) -> io::Result<Self> {
        // SAFETY: fcntl only queries the descriptor; an invalid one gives EBADF.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        // SAFETY: the descriptor is open, and this process owns it from here on (tenure
        // handed it to the watchdog process for this use alone).
        Self::map(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn map(fd: OwnedFd) -> io::Result<Self> {
        // A file shorter than SIZE would fault on access: check the length first.
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes into the buffer we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it initialised the buffer.
        let size = unsafe { stat.assume_init() }.st_size;
        if usize::try_from(size).map_or(true, |s| s < SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the deadline cell is too short",
            ));
        }
        // SAFETY: a new shared mapping of SIZE bytes of the file, at an address the kernel
        // picks; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // A mapping is page-aligned, so aligned for AtomicU64, and not null once not
        // MAP_FAILED.
        let words = NonNull::new(addr.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { words, fd })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < WORDS);
        // SAFETY: `i < WORDS`, inside the SIZE-byte mapping, which lives as long as `self`;
        // AtomicU64 has u64's layout, and every process touches these words atomically only.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    /// The descriptor to hand to the watchdog process.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Moves the deadline to `at` if that is later: deadlines never move back.
    pub fn extend(&self, at: Instant) {
        self.word(DEADLINE)
            .fetch_max(monotonic_ns(at), Ordering::AcqRel);
    }

    /// The deadline, as absolute `CLOCK_MONOTONIC` nanoseconds.
    pub fn deadline_ns(&self) -> u64 {
        self.word(DEADLINE).load(Ordering::Acquire)
    }

    /// Records a kill at `now_ns` judged by `deadline_ns`; the first report wins.
    pub fn report_kill(&self, now_ns: u64, deadline_ns: u64) {
        if self
            .word(KILLED_AT)
            .compare_exchange(0, now_ns.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.word(KILLED_BY).store(deadline_ns, Ordering::Release);
        }
    }

    /// The report of a kill by the watchdog, if either half killed the group.
    pub fn kill_report(&self) -> Option<KillReport> {
        let at = self.word(KILLED_AT).load(Ordering::Acquire);
        (at != 0).then(|| match self.word(KILLED_BY).load(Ordering::Acquire) {
            0 => KillReport::NoDeadline,
            by => KillReport::Late(Duration::from_nanos(at.saturating_sub(by))),
        })
    }
}

impl Drop for DeadlineCell {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives
        // `self` (`word` borrows `self`). The descriptor closes after.
        unsafe { libc::munmap(self.words.as_ptr().cast(), SIZE) };
    }
}

/// Keeps descriptor `fd` open across `exec` in a forked child. Async-signal-safe (one
/// `fcntl`), for a `pre_exec` closure.
pub fn inherit_in_child(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments only.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `at` as absolute `CLOCK_MONOTONIC` nanoseconds (the clock `Instant` reads on Linux).
pub fn monotonic_ns(at: Instant) -> u64 {
    let now = Instant::now();
    let base = now_ns();
    match at.checked_duration_since(now) {
        Some(ahead) => base.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)),
        None => base.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_ns_matches_the_clock() {
        let now = Instant::now();
        let a = monotonic_ns(now + Duration::from_secs(2));
        let b = now_ns();
        assert!(a > b + 1_900_000_000 && a < b + 2_100_000_000, "{a} vs {b}");
        assert!(monotonic_ns(now) <= now_ns());
    }

    /// Two mappings of one cell (as tenure's and the watchdog process's are) see each other's
    /// writes; the deadline only moves later; the first kill report wins.
    #[test]
    fn both_sides_share_the_deadline_and_the_report() {
        let tenure = DeadlineCell::create().expect("memfd");
        // SAFETY (test): dup gives the second mapping a descriptor of its own to own.
        let dup = unsafe { libc::dup(tenure.fd()) };
        let watchdog = DeadlineCell::open(dup).expect("map the same memfd");
        assert_eq!(
            watchdog.deadline_ns(),
            0,
            "a new cell's deadline has passed"
        );
        let at = Instant::now() + Duration::from_secs(5);
        tenure.extend(at);
        tenure.extend(at - Duration::from_secs(1));
        // Converting an `Instant` reads two clocks, so two conversions of one instant can
        // differ by the time between the reads: compare to the microsecond.
        let (seen, want) = (watchdog.deadline_ns(), monotonic_ns(at));
        assert!(seen.abs_diff(want) < 1_000, "{seen} vs {want}");
        assert_eq!(tenure.kill_report(), None);
        watchdog.report_kill(1_000, 400);
        watchdog.report_kill(2_000, 100);
        assert_eq!(
            tenure.kill_report(),
            Some(KillReport::Late(Duration::from_nanos(600)))
        );
    }

    #[test]
    fn a_kill_before_any_deadline_says_so() {
        let cell = DeadlineCell::create().expect("memfd");
        cell.report_kill(now_ns(), cell.deadline_ns());
        assert_eq!(cell.kill_report(), Some(KillReport::NoDeadline));
    }

    #[test]
    fn a_descriptor_that_is_not_a_cell_is_refused() {
        assert!(DeadlineCell::open(-1).is_err());
        assert!(DeadlineCell::open(9_999).is_err());
        let empty = DeadlineCell::create().expect("memfd");
        // SAFETY (test): truncating our own memfd to nothing.
        assert_eq!(unsafe { libc::ftruncate(empty.fd(), 0) }, 0);
        // SAFETY (test): dup gives the mapping a descriptor of its own to own.
        let dup = unsafe { libc::dup(empty.fd()) };
        assert!(
            DeadlineCell::open(dup).is_err(),
            "mapped a cell too short to hold the words"
        );
    }
}
