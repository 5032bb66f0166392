//! A scripted API server for unit tests of the fence's decisions (the per-term proof's and
//! `tenure policy --check`'s): the answers to give, in order, and when each dry run was asked.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::proof::{Answer, Probe};

/// The answers to give in order (the last one repeated), and when each dry run was asked,
/// relative to the start.
pub(super) struct Script {
    answers: Mutex<VecDeque<(Probe, Answer)>>,
    asked: Mutex<Vec<(Probe, Duration)>>,
    start: Instant,
}

impl Script {
    pub(super) fn new(answers: Vec<(Probe, Answer)>) -> Self {
        Self {
            answers: Mutex::new(answers.into()),
            asked: Mutex::new(Vec::new()),
            start: Instant::now(),
        }
    }

    /// The next answer; the dry run asked must be the one the script expects.
    pub(super) fn ask(&self, which: Probe) -> std::future::Ready<Answer> {
        self.asked
            .lock()
            .expect("lock")
            .push((which, self.start.elapsed()));
        let mut answers = self.answers.lock().expect("lock");
        let (expected, answer) = if answers.len() > 1 {
            answers.pop_front().expect("scripted")
        } else {
            answers.front().cloned().expect("scripted")
        };
        assert_eq!(
            which, expected,
            "asked {which:?} where the script has {expected:?}"
        );
        std::future::ready(answer)
    }

    /// Which dry runs were asked, and when.
    pub(super) fn asked(&self) -> Vec<(Probe, Duration)> {
        self.asked.lock().expect("lock").clone()
    }
}
