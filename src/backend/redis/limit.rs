//! Bounds what one reply can make tenure hold: a stream wrapper that follows the RESP framing of
//! the bytes it passes to the redis crate's parser and cuts the connection when a reply would
//! exceed [`MAX_REPLY_BYTES`].
//!
//! The redis crate reads a reply into one growing buffer until the reply is complete, whatever
//! length the reply declares, and keeps reading after a request timed out; it has no size limit.
//! So a server (hostile, or a proxy gone wrong) that declares a 4 GB string and keeps sending
//! would make tenure allocate gigabytes. The wrapper sees each reply's headers before the parser
//! does: a declared length or element count over the budget fails at once, before any of it
//! arrives; a reply that grows over the budget fails when it does. Either way the read returns
//! an error that makes the redis crate drop the connection, and the connection's [`Tripwire`]
//! says why, so the request fails with a [`Protocol`](crate::backend::BackendErrorKind::Protocol)
//! error naming the limit.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most one reply from the server may hold, in bytes: its wire bytes, with every element of
/// an array, map or set counted as 64 bytes more (about what it costs in memory once parsed). A
/// reply that would exceed it, or that could never be parsed, fails the request with
/// [`BackendErrorKind::Protocol`](crate::backend::BackendErrorKind::Protocol) and closes the
/// connection; a declared length over it fails before any of the reply's bytes are read.
///
/// tenure's own replies are far smaller: a script call for 256 locks, each busy with a short
/// identity, counts about 80 KiB. Identities of megabytes (one reply carries one per busy lock)
/// or a [`max_batch`](super::RedisConfig::max_batch) of tens of thousands can reach it.
///
/// It bounds every connection tenure opens, over TCP, a Unix socket or TLS (tenure does the TLS
/// handshake and bounds the decrypted bytes): a single server's command connection, a Redis
/// Cluster's node connections, and the subscriber connection.
pub const MAX_REPLY_BYTES: usize = 8 << 20;

/// What each element of an aggregate counts against [`MAX_REPLY_BYTES`], on top of its bytes
/// (a parsed value takes about this much memory, however few bytes it came in).
const ELEMENT_COST: u64 = 64;

/// The deepest nesting of aggregates accepted (tenure's replies nest 3 deep; the redis crate's
/// parser refuses more than 100).
const MAX_DEPTH: usize = 32;

/// The longest length header accepted, in bytes (an `i64` has at most 20 characters).
const MAX_HEADER: usize = 24;

/// Why a connection was cut: a reply over the limit, or one no parser could finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplyRefused(String);

impl std::fmt::Display for ReplyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplyRefused {}

/// A reply over the size limit.
fn too_big(what: impl std::fmt::Display) -> ReplyRefused {
    ReplyRefused(format!(
        "the server's reply {what}; tenure accepts at most {MAX_REPLY_BYTES} bytes per reply (MAX_REPLY_BYTES), so it closed the connection"
    ))
}

/// A reply no parser could finish, or one nested deeper than any Redis answer.
fn malformed(what: impl std::fmt::Display) -> ReplyRefused {
    ReplyRefused(format!(
        "the server's reply {what}, which is no Redis answer, so tenure closed the connection"
    ))
}

/// Set once when a connection's stream refused a reply; shared with whoever sends on the
/// connection, so that a request failing with "connection closed" can say why.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tripwire(Arc<OnceLock<ReplyRefused>>);

impl Tripwire {
    /// Why the connection was cut, if it was.
    pub(crate) fn get(&self) -> Option<&ReplyRefused> {
        self.0.get()
    }

    fn trip(&self, why: ReplyRefused) {
        let _ = self.0.set(why);
    }
}

/// Where the scanner is within a reply.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Expecting a value's type byte.
    Type,
    /// In a header line of type `kind`; `cr` when the last byte was `\r`.
    Line { kind: u8, cr: bool },
    /// In a string's payload: this many bytes left, its closing CRLF included.
    Payload(u64),
}

/// Follows the RESP2/RESP3 framing of a byte stream the way the redis crate's parser reads it
/// (lines end at CRLF; lengths parse as `i64` after trimming), and keeps each reply within
/// [`MAX_REPLY_BYTES`].
#[derive(Debug)]
pub(crate) struct Scanner {
    limit: u64,
    state: State,
    /// The current reply's cost so far (bytes, declared payloads, elements).
    used: u64,
    /// Elements still expected at each open aggregate, outermost first.
    open: Vec<u64>,
    /// The current header line, for length headers.
    header: [u8; MAX_HEADER],
    header_len: usize,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::with_limit(MAX_REPLY_BYTES)
    }
}

impl Scanner {
    fn with_limit(limit: usize) -> Self {
        Self {
            limit: limit as u64,
            state: State::Type,
            used: 0,
            open: Vec::new(),
            header: [0; MAX_HEADER],
            header_len: 0,
        }
    }

    fn charge(&mut self, cost: u64) -> Result<(), ReplyRefused> {
        self.used = self.used.saturating_add(cost);
        if self.used > self.limit {
            return Err(too_big(format_args!(
                "exceeds {} bytes (counting {ELEMENT_COST} per element)",
                self.limit
            )));
        }
        Ok(())
    }

    /// Passes `bytes` through the framing; an error once a reply breaks the limit.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), ReplyRefused> {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Payload(left) => {
                    // Charged in full when its header declared it.
                    let n = left.min((bytes.len() - i) as u64);
                    i += n as usize;
                    if n == left {
                        self.value_done();
                    } else {
                        self.state = State::Payload(left - n);
                    }
                }
                State::Type => {
                    let kind = bytes[i];
                    i += 1;
                    self.charge(1)?;
                    if !b"+-:$*%|~_,#!=(>".contains(&kind) {
                        return Err(malformed(format_args!(
                            "starts with {:?}, which is no RESP type",
                            char::from(kind)
                        )));
                    }
                    self.header_len = 0;
                    self.state = State::Line { kind, cr: false };
                }
                State::Line { kind, cr } => {
                    // Up to the end of the line, or of what arrived.
                    let rest = &bytes[i..];
                    let end = rest.iter().position(|&b| b == b'\n');
                    let take = end.map_or(rest.len(), |e| e + 1);
                    self.charge(take as u64)?;
                    let line = &rest[..take];
                    i += take;
                    let ends = match end {
                        // "\r\n", the CR in this chunk or the last one.
                        Some(e) => (e == 0 && cr) || (e > 0 && rest[e - 1] == b'\r'),
                        None => false,
                    };
                    if is_length(kind) {
                        let body = if ends { &line[..line.len() - 1] } else { line };
                        let end = self.header_len + body.len();
                        if end > MAX_HEADER {
                            return Err(malformed("has a length header too long to be one"));
                        }
                        self.header[self.header_len..end].copy_from_slice(body);
                        self.header_len = end;
                    }
                    if ends {
                        self.line_done(kind)?;
                    } else {
                        let cr = line.last().map_or(cr, |&b| b == b'\r');
                        self.state = State::Line { kind, cr };
                    }
                }
            }
        }
        Ok(())
    }

    /// A header line of `kind` ended (its text, CR included, is in `header`).
    fn line_done(&mut self, kind: u8) -> Result<(), ReplyRefused> {
        if !is_length(kind) {
            self.value_done();
            return Ok(());
        }
        let text = &self.header[..self.header_len];
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let n: i64 = std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| malformed("has a malformed length header"))?;
        match (kind, u64::try_from(n)) {
            // Null string, array, set; an empty push.
            (b'$' | b'*' | b'~', Err(_)) | (b'>', Err(_) | Ok(0)) => self.value_done(),
            (_, Err(_)) => return Err(malformed(format_args!("declares a length of {n}"))),
            (b'$' | b'!' | b'=', Ok(len)) => {
                if len > self.limit {
                    return Err(too_big(format_args!("declares a {len}-byte string")));
                }
                self.charge(len)?;
                self.state = State::Payload(len + 2);
            }
            (_, Ok(count)) => {
                let count = match kind {
                    b'%' => count.checked_mul(2),
                    b'|' => count.checked_mul(2).and_then(|c| c.checked_add(1)),
                    _ => Some(count),
                }
                .filter(|c| *c <= self.limit / ELEMENT_COST)
                .ok_or_else(|| too_big(format_args!("declares {n} elements")))?;
                self.charge(count * ELEMENT_COST)?;
                if count == 0 {
                    self.value_done();
                } else {
                    if self.open.len() >= MAX_DEPTH {
                        return Err(malformed(format_args!(
                            "nests aggregates more than {MAX_DEPTH} deep"
                        )));
                    }
                    self.open.push(count);
                    self.state = State::Type;
                }
            }
        }
        Ok(())
    }

    /// A value ended: count it in its aggregate, closing every aggregate it completes; a reply
    /// ended when no aggregate is open.
    fn value_done(&mut self) {
        self.state = State::Type;
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return;
            }
            self.open.pop();
        }
        self.used = 0;
    }
}

/// Whether a header of this type carries a length or count.
fn is_length(kind: u8) -> bool {
    matches!(kind, b'$' | b'!' | b'=' | b'*' | b'~' | b'>' | b'%' | b'|')
}

/// A stream whose replies are kept within [`MAX_REPLY_BYTES`].
pub(crate) struct Limited<S> {
    inner: S,
    scanner: Scanner,
    tripwire: Tripwire,
}

impl<S> Limited<S> {
    pub(crate) fn new(inner: S, tripwire: Tripwire) -> Self {
        Self {
            inner,
            scanner: Scanner::default(),
            tripwire,
        }
    }
}

/// The error a cut connection's reads return: "connection aborted", which the redis crate
/// treats as a dropped connection.
fn aborted(why: &ReplyRefused) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, why.clone())
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.tripwire.get() {
            return Poll::Ready(Err(aborted(why)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Err(why) = this.scanner.feed(&buf.filled()[before..]) {
            // Nothing of this read reaches the parser.
            buf.set_filled(before);
            tracing::warn!(reason = %why, "redis reply refused");
            this.tripwire.trip(why.clone());
            return Poll::Ready(Err(aborted(&why)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes` whole, then again one byte at a time; both must agree.
    fn scan(limit: usize, bytes: &[u8]) -> Result<(), ReplyRefused> {
        let whole = Scanner::with_limit(limit).feed(bytes);
        let mut s = Scanner::with_limit(limit);
        let split = bytes
            .iter()
            .try_for_each(|b| s.feed(std::slice::from_ref(b)));
        assert_eq!(whole, split, "chunking changed the verdict on {bytes:?}");
        whole
    }

    fn complete(limit: usize, bytes: &[u8]) -> bool {
        let mut s = Scanner::with_limit(limit);
        s.feed(bytes).expect("accepted");
        let done = s.is_between_replies();
        // Every split into two chunks, for inputs small enough (the check is quadratic).
        let splits = if bytes.len() <= 4096 {
            1..bytes.len()
        } else {
            0..0
        };
        for at in splits {
            let (a, b) = bytes.split_at(at);
            let mut split = Scanner::with_limit(limit);
            split.feed(a).expect("first chunk accepted");
            split.feed(b).expect("second chunk accepted");
            assert_eq!(
                split.is_between_replies(),
                done,
                "split at {at} changed where {:?} ends",
                String::from_utf8_lossy(bytes)
            );
        }
        done
    }

    impl Scanner {
        fn is_between_replies(&self) -> bool {
            matches!(self.state, State::Type) && self.open.is_empty() && self.used == 0
        }
    }

    #[test]
    fn tenures_replies_pass_and_end_where_the_parser_ends_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b":1796003281177730\r\n",
            b"$40\r\n0123456789012345678901234567890123456789\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:0\r\n:9989\r\n$6\r\nhost:1\r\n",
            b"*2\r\n*3\r\n:0\r\n:-1\r\n$-1\r\n*2\r\n:-1\r\n$11\r\nWRONGTYPE x\r\n",
            b"*3\r\n$7\r\nmessage\r\n$13\r\ntenure:{jobs}\r\n$8\r\ng:12:a\rb\r\n",
            b"%1\r\n+server\r\n+redis\r\n",
            b"|1\r\n+key\r\n+value\r\n:5\r\n",
            b">3\r\n+message\r\n+ch\r\n+payload\r\n",
            b">0\r\n",
            b"~2\r\n_\r\n#t\r\n",
            b"=8\r\ntxt:abcd\r\n",
            b"!5\r\nERR x\r\n",
            b",1.5\r\n(123\r\n",
        ];
        for r in replies {
            assert!(scan(1 << 20, r).is_ok(), "{r:?}");
            assert!(
                complete(1 << 20, r),
                "{:?} must end a reply",
                String::from_utf8_lossy(r)
            );
        }
        // A map counts two values per entry, an attribute two per entry and then the value it
        // annotates: the reply is not over after the first of them.
        assert!(!complete(1 << 20, b"%1\r\n+server\r\n"));
        assert!(!complete(1 << 20, b"|1\r\n+key\r\n+value\r\n"));
        // A simple string may hold a bare LF: only CRLF ends it, also when a chunk ends
        // between the two (`complete` tries every split) or between a CR and another byte.
        assert!(!complete(1 << 20, b"+a\nb"));
        assert!(complete(1 << 20, b"+a\nb\r\n"));
        assert!(complete(1 << 20, b"+a\rb\nc\r\n"));
        // A string's payload split across chunks, then the next reply.
        assert!(complete(1 << 20, b"$10\r\n0123456789\r\n+OK\r\n"));
        // Many replies in a row, each within the budget, though not all together.
        let many = b"$6\r\nabcdef\r\n".repeat(100);
        assert!(scan(20, &many).is_ok());
    }

    #[test]
    fn declared_sizes_over_the_limit_fail_before_their_bytes_arrive() {
        let e = scan(MAX_REPLY_BYTES, b"$4000000000\r\n").expect_err("4 GB string");
        assert!(e.to_string().contains("4000000000-byte"), "{e}");
        assert!(e.to_string().contains(&MAX_REPLY_BYTES.to_string()), "{e}");
        assert!(scan(MAX_REPLY_BYTES, b"*4000000000\r\n").is_err());
        assert!(scan(MAX_REPLY_BYTES, b"%9223372036854775807\r\n").is_err());
        assert!(scan(MAX_REPLY_BYTES, b"|9223372036854775807\r\n").is_err());
        assert!(scan(100, b"$101\r\n").is_err());
        // Counts are refused by what they declare, before any element arrives.
        let e = scan(1000, b"*16\r\n").expect_err("16 elements of 64 over 1000");
        assert!(e.to_string().contains("declares 16 elements"), "{e}");
        assert!(scan(1000, b"*15\r\n").is_ok());
        // A reply of exactly the limit passes; one byte more does not.
        assert!(complete(5, b"+OK\r\n"));
        assert!(scan(4, b"+OK\r\n").is_err());
        // Two elements (64 each) and their headers leave room for 60 bytes, not 70.
        assert!(scan(200, b"*2\r\n$60\r\n").is_ok());
        assert!(scan(200, b"*2\r\n$70\r\n").is_err());
    }

    #[test]
    fn malformed_or_endless_framing_fails() {
        assert!(
            scan(1 << 20, b"!-1\r\n").is_err(),
            "the parser would wait forever"
        );
        assert!(scan(1 << 20, b"%-1\r\n").is_err());
        assert!(scan(1 << 20, b"$abc\r\n").is_err());
        assert!(scan(1 << 20, b"$0000000000000000000000000001\r\n").is_err());
        // The longest length header taken: MAX_HEADER bytes with its CR.
        let longest = [&b"$"[..], &[b'0'; MAX_HEADER - 2], b"5\r\n12345\r\n"].concat();
        assert!(complete(1 << 20, &longest));
        let longer = [&b"$"[..], &[b'0'; MAX_HEADER - 1], b"5\r\n12345\r\n"].concat();
        assert!(scan(1 << 20, &longer).is_err());
        assert!(scan(1 << 20, b"@\r\n").is_err());
        // A line that never ends counts against the budget.
        assert!(scan(1000, &[b'+'; 2000]).is_err());
        assert!(scan(1000, &[b'x'; 10]).is_err());
    }

    #[test]
    fn growth_and_nesting_are_bounded() {
        let deep = b"*1\r\n".repeat(100_000);
        let e = scan(MAX_REPLY_BYTES, &deep).expect_err("deep");
        assert!(e.to_string().contains("deep"), "{e}");
        let mut nested = b"*1\r\n".repeat(MAX_DEPTH);
        nested.extend_from_slice(b":1\r\n");
        assert!(complete(MAX_REPLY_BYTES, &nested));
        // A reply is charged as it grows.
        let mut three = b"*3\r\n".to_vec();
        let string = [&b"$300\r\n"[..], &[b'x'; 300], b"\r\n"].concat();
        three.extend(string.repeat(2));
        assert!(scan(1000, &three).is_ok());
        three.extend(b"$300\r\n");
        assert!(scan(1000, &three).is_err());
        // Wide replies within the budget pass.
        let mut wide = b"*100000\r\n".to_vec();
        wide.extend(b"$1\r\nx\r\n".repeat(100_000));
        assert!(complete(MAX_REPLY_BYTES, &wide));
    }
}
