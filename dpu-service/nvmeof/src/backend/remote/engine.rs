//! What a remote namespace's poll groups and its initiator thread share,
//! under one lock: the I/O queue of the connection up, the operations in
//! flight and the commands not yet sent. A poll group starts an operation
//! by making and sending its commands itself, with no hand-over to
//! another thread; the poll groups watching the socket read the
//! completions and send what waited for them (the initiator thread does
//! when none watches), and the initiator thread times commands out, and
//! takes the queue down and puts it up again.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rustix::event::epoll;

use super::ops::{self, Dest, Geometry, Op, Todo};
use super::{out_of_range, Job, Shared};
use crate::host::{Completion, Error, Queue, Transfer};
use crate::spec::Status;

/// A command in flight on the I/O queue.
struct Cmd {
    /// Index of its operation.
    op: usize,
    into: Dest,
    /// Bytes a read brings.
    len: usize,
    deadline: Instant,
}

/// The I/O side of a remote namespace (see the module documentation).
#[derive(Default)]
pub(super) struct Engine {
    /// The connection's I/O queue and how its commands are made, while
    /// one is up.
    io: Option<(Queue<TcpStream>, Geometry)>,
    /// Operations in flight, by index.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Commands of operations not yet submitted, in order.
    todo: VecDeque<Todo>,
    /// The I/O queue's commands in flight, by CID.
    cmds: Vec<Option<Cmd>>,
    /// A failure a poll group met while sending: the initiator thread
    /// takes the connection down.
    pub failed: Option<Error>,
    /// The socket may have bytes: `poll` said so, or the last read
    /// brought some. It is read only then, not on every turn.
    pub readable: bool,
    /// A connection on a preferred path waits to take over: nothing more
    /// is submitted here until what is in flight has completed.
    pub draining: bool,
}

impl Engine {
    /// True while a connection is up and has not failed.
    pub fn is_up(&self) -> bool {
        self.io.is_some() && self.failed.is_none()
    }

    /// Serves from now on over `io`, its commands made by `g`; its socket
    /// goes into the poller the poll groups watch.
    pub fn install(&mut self, s: &Shared, io: Queue<TcpStream>, g: Geometry) {
        if let Err(e) = epoll::add(
            &s.poller,
            io.wire(),
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        ) {
            // The initiator thread's sweeps read it all the same.
            tracing::warn!(namespace = %s.what, error = %e, "cannot watch a remote I/O queue from the poll groups");
        }
        let entries = usize::from(io.pair().entries());
        self.cmds = (0..entries).map(|_| None).collect();
        self.io = Some((io, g));
        self.failed = None;
        self.readable = true;
        self.draining = false;
    }

    /// Starts `job` on a poll group's thread: its commands made and, when
    /// nothing else was in flight, sent as far as the socket takes them.
    /// With commands in flight they wait for the initiator thread, which
    /// sends all there is each time a completion wakes it: one write for
    /// many commands rather than one each. True when the initiator thread
    /// must be woken: output is left for it to send, or sending failed.
    pub fn start(&mut self, s: &Shared, job: Job) -> bool {
        let idle = !self.busy();
        self.accept(s, job);
        if !idle {
            return false;
        }
        let sent = self.submit(s).and_then(|_| self.send());
        match sent {
            Ok(all) => !all,
            Err(e) => {
                self.fail(s, e);
                true
            }
        }
    }

    /// Notes that the connection failed with `e`, for the initiator
    /// thread to take down; the poll groups stop watching its socket
    /// (level-triggered, a broken one would wake them until then).
    pub fn fail(&mut self, s: &Shared, e: Error) {
        if let Some((q, _)) = &self.io {
            let _ = epoll::delete(&s.poller, q.wire());
        }
        self.failed.get_or_insert(e);
    }

    /// Takes a job: its operation made, its commands queued.
    pub fn accept(&mut self, s: &Shared, job: Job) {
        let Some((_, g)) = &self.io else {
            return s.finish(job.done, job.bytes, Err(s.unreachable()));
        };
        let idx = self.free.pop().unwrap_or_else(|| {
            self.ops.push(None);
            self.ops.len() - 1
        });
        let (op, todo) = ops::plan(job.io, job.done, job.bytes, idx, g);
        self.ops[idx] = Some(op);
        if todo.is_empty() {
            self.finish_if_over(s, idx);
        } else {
            self.todo.push_back(todo);
        }
    }

    /// Submits queued commands while the I/O queue has room: true when
    /// one went.
    pub fn submit(&mut self, s: &Shared) -> Result<bool, Error> {
        if self.draining {
            return Ok(false);
        }
        let Some((q, g)) = &mut self.io else {
            return Ok(false);
        };
        let mut any = false;
        let deadline = Instant::now() + s.spec.io_timeout;
        while let Some(t) = self.todo.front_mut() {
            let Some(cid) = q.pair().free_cid() else {
                break;
            };
            let idx = t.op;
            let Some(cmd) = t.next(g) else {
                self.todo.pop_front();
                continue;
            };
            if t.is_empty() {
                self.todo.pop_front();
                if let Some(op) = self.ops[idx].as_mut() {
                    op.more = false;
                }
            }
            let len = match &cmd.transfer {
                Transfer::Read(b) => b.len(),
                _ => 0,
            };
            q.submit(cid, cmd.sqe, cmd.transfer)?;
            if let Some(op) = self.ops[idx].as_mut() {
                op.outstanding += 1;
            }
            self.cmds[usize::from(cid)] = Some(Cmd {
                op: idx,
                into: cmd.into,
                len,
                deadline,
            });
            any = true;
        }
        if any {
            // While operations keep coming the initiator may not sleep,
            // so poll would not say the socket has bytes: look then.
            self.readable = true;
        }
        Ok(any)
    }

    /// Sends what the socket takes: true when nothing is left.
    pub fn send(&mut self) -> Result<bool, Error> {
        match &mut self.io {
            Some((q, _)) => q.send_some(),
            None => Ok(true),
        }
    }

    /// Reads the socket if it may have bytes, and completes what came:
    /// true when bytes came.
    pub fn receive(&mut self, s: &Shared) -> Result<bool, Error> {
        if !self.readable {
            return Ok(false);
        }
        let Some((q, _)) = &mut self.io else {
            return Ok(false);
        };
        self.readable = q.read_some()?;
        if !self.readable {
            return Ok(false);
        }
        while let Some((q, _)) = &mut self.io {
            let Some(done) = q.poll_completion()? else {
                break;
            };
            self.complete(s, done);
        }
        Ok(true)
    }

    /// True when a command is past its deadline.
    pub fn late(&self, now: Instant) -> bool {
        self.cmds.iter().flatten().any(|c| c.deadline <= now)
    }

    /// True when commands are in flight.
    pub fn busy(&self) -> bool {
        self.cmds.iter().any(Option::is_some)
    }

    /// True when output waits for the socket.
    pub fn has_output(&self) -> bool {
        self.io.as_ref().is_some_and(|(q, _)| q.pair().has_output())
    }

    /// Hands a completion of the I/O queue to its operation.
    fn complete(&mut self, s: &Shared, done: Completion) {
        let Some(cmd) = self
            .cmds
            .get_mut(usize::from(done.cid()))
            .and_then(Option::take)
        else {
            tracing::error!(cid = done.cid(), "remote completion of no command of ours");
            return;
        };
        let Some(op) = self.ops[cmd.op].as_mut() else {
            return;
        };
        op.outstanding -= 1;
        if done.is_success() {
            match cmd.into {
                Dest::Whole => {
                    if op.read_len.is_some_and(|n| done.data.len() != n) {
                        op.error.get_or_insert_with(|| short(&s.what));
                    }
                    op.buf = done.data;
                }
                Dest::At(at) => {
                    let part = op.buf.get_mut(at..at + cmd.len);
                    match part {
                        Some(p) if done.data.len() == p.len() => p.copy_from_slice(&done.data),
                        _ => {
                            op.error.get_or_insert_with(|| short(&s.what));
                        }
                    }
                }
                Dest::Nowhere => {}
            }
        } else {
            let len = s.len.load(Ordering::Acquire);
            op.error
                .get_or_insert_with(|| status_error(&s.what, done.status(), len));
        }
        self.finish_if_over(s, cmd.op);
    }

    /// Completes operation `idx` if nothing of it is left.
    fn finish_if_over(&mut self, s: &Shared, idx: usize) {
        if !self.ops[idx].as_ref().is_some_and(Op::is_over) {
            return;
        }
        let Some(mut op) = self.ops[idx].take() else {
            return;
        };
        self.free.push(idx);
        let r = op.result();
        if let Some(done) = op.done.take() {
            s.finish(done, op.bytes, r);
        }
    }

    /// Takes the connection down (its socket closes with the queue) and
    /// fails every operation in flight or queued on it with `err()`.
    pub fn take_down(&mut self, s: &Shared, err: &dyn Fn() -> io::Error) {
        if let Some((q, _)) = self.io.take() {
            let _ = epoll::delete(&s.poller, q.wire());
        }
        self.todo.clear();
        self.cmds.iter_mut().for_each(|c| *c = None);
        for idx in 0..self.ops.len() {
            if let Some(mut op) = self.ops[idx].take() {
                self.free.push(idx);
                if let Some(done) = op.done.take() {
                    s.finish(done, op.bytes, Err(err()));
                }
            }
        }
    }
}

/// The error of a read that brought less than asked.
fn short(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("remote namespace {what} sent less data than a read asked for"),
    )
}

/// The error for a remote's failed command, of a kind the target answers
/// alike: out of range, unavailable (for statuses a host retries or fails
/// over on) or a media error.
fn status_error(what: &str, st: Status, len: u64) -> io::Error {
    let retry = matches!((st.sct, st.sc), (0, 0x07 | 0x22 | 0x82)) || st.sct == 3;
    if (st.sct, st.sc) == (0, 0x80) {
        return out_of_range(0, 0, len);
    }
    let msg = format!(
        "remote namespace {what} answered status type {} code {:#04x}",
        st.sct, st.sc
    );
    if retry {
        io::Error::new(io::ErrorKind::NotConnected, msg)
    } else {
        io::Error::other(msg)
    }
}
