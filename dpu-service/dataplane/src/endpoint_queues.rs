//! Queues between the workers and the storage endpoints' TCP/IP stacks.
//!
//! The switch forwards a frame for a storage endpoint to the endpoint's
//! virtual port ([`crate::switch::EndpointPort`]); the worker that decided
//! it copies it into that endpoint's [`EndpointQueues`], and the stack
//! takes it from there. The stack's own frames go the other way and enter
//! the switch as received on the virtual port.
//!
//! Invariants:
//! - A worker never blocks and never waits for the stack: every queue is
//!   a bounded lock-free [`ArrayQueue`]; a frame that finds its queue full
//!   is dropped and counted ([`EndpointQueues::full`]), which the worker
//!   reports as `DropReason::EndpointFull`.
//! - Memory is bounded: each lane owns at most `2 × depth` buffers of
//!   `frame_max` bytes toward the stack, and keeps at most `depth`
//!   emptied ones from it. Buffers are recycled ([`EndpointQueues::recycle`]),
//!   so once warm the packet path allocates nothing.
//! - Each worker has a lane of its own: connection tracking is per
//!   worker (symmetric RSS sends both directions of a flow to one), so a
//!   stack answers a frame through the lane it came from, and the worker
//!   that saw a connection open sees its replies.
//! - Buffers go back the other way too: the worker copies a frame the
//!   stack sent into a packet of its driver and keeps the emptied buffer
//!   for the stack's next frame ([`EndpointQueues::send_buffer`]).
//! - Queues belong to an endpoint, not to a port number:
//!   [`EndpointTable`] maps one configuration's virtual ports to them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

/// One worker's queues to and from one endpoint.
#[derive(Debug)]
struct Lane {
    /// Frames for the stack.
    to_stack: ArrayQueue<Vec<u8>>,
    /// Frames from the stack, for the worker's input.
    from_stack: ArrayQueue<Vec<u8>>,
    /// Emptied buffers, for the next frame to the stack.
    free: ArrayQueue<Vec<u8>>,
    /// Buffers this lane has allocated (at most the capacity of
    /// `to_stack` and `free` together).
    allocated: AtomicUsize,
    /// Buffers the worker emptied of the stack's frames, for the stack's
    /// next ones.
    sent_free: ArrayQueue<Vec<u8>>,
    /// Frames dropped because `to_stack` was full, too long, or no
    /// buffer was left.
    full: AtomicU64,
}

/// The frames between the workers and one storage endpoint's stack: per
/// worker, a bounded queue each way.
#[derive(Debug)]
pub struct EndpointQueues {
    lanes: Box<[Lane]>,
    frame_max: usize,
}

impl EndpointQueues {
    /// Queues for `workers` workers (at least one), each way at most
    /// `depth` frames (at least one) of at most `frame_max` bytes.
    pub fn new(workers: usize, depth: usize, frame_max: usize) -> EndpointQueues {
        let depth = depth.max(1);
        let lanes = (0..workers.max(1))
            .map(|_| Lane {
                to_stack: ArrayQueue::new(depth),
                from_stack: ArrayQueue::new(depth),
                free: ArrayQueue::new(depth),
                sent_free: ArrayQueue::new(depth),
                allocated: AtomicUsize::new(0),
                full: AtomicU64::new(0),
            })
            .collect();
        EndpointQueues { lanes, frame_max }
    }

    /// Frames each lane's queues hold, each way.
    pub fn depth(&self) -> usize {
        self.lanes.first().map_or(0, |l| l.to_stack.capacity())
    }

    /// The number of lanes (workers).
    pub fn workers(&self) -> usize {
        self.lanes.len()
    }

    /// The lane of `worker` (workers beyond the lanes share them, modulo).
    fn lane(&self, worker: usize) -> &Lane {
        &self.lanes[worker % self.lanes.len()]
    }

    /// Worker side: copies `frame` toward the stack through `worker`'s
    /// lane. False, having counted the drop, if the queue is full, the
    /// frame longer than `frame_max`, or the lane's buffers all taken.
    pub fn deliver(&self, worker: usize, frame: &[u8]) -> bool {
        let lane = self.lane(worker);
        let refuse = || {
            lane.full.fetch_add(1, Ordering::Relaxed);
            false
        };
        if frame.len() > self.frame_max || lane.to_stack.is_full() {
            return refuse();
        }
        let mut buf = match lane.free.pop() {
            Some(b) => b,
            None => {
                let cap = lane.to_stack.capacity() + lane.free.capacity();
                if lane.allocated.load(Ordering::Relaxed) >= cap {
                    return refuse();
                }
                lane.allocated.fetch_add(1, Ordering::Relaxed);
                Vec::with_capacity(self.frame_max)
            }
        };
        buf.clear();
        buf.extend_from_slice(frame);
        match lane.to_stack.push(buf) {
            Ok(()) => true,
            Err(buf) => {
                self.recycle(worker, buf);
                refuse()
            }
        }
    }

    /// Worker side: hands the next frame the stack sent through
    /// `worker`'s lane to `f` (which makes a packet of it, to run through
    /// the switch as received on the endpoint's virtual port) and keeps
    /// its buffer for the stack's next frame. `None` when there is none.
    pub fn take_sent_with<R>(&self, worker: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let lane = self.lane(worker);
        let buf = lane.from_stack.pop()?;
        let r = f(&buf);
        // A full free list frees the buffer instead.
        let _ = lane.sent_free.push(buf);
        Some(r)
    }

    /// Stack side: the next frame delivered through `worker`'s lane. Give
    /// the buffer back with [`EndpointQueues::recycle`] once read.
    pub fn receive(&self, worker: usize) -> Option<Vec<u8>> {
        self.lane(worker).to_stack.pop()
    }

    /// Stack side: gives back a buffer [`EndpointQueues::receive`] handed
    /// out, for the next frame; one the lane has no room for is freed
    /// (and may be allocated again).
    pub fn recycle(&self, worker: usize, buf: Vec<u8>) {
        let lane = self.lane(worker);
        if buf.capacity() < self.frame_max || lane.free.push(buf).is_err() {
            // Saturating: a buffer that was not the lane's frees no count.
            let _ = lane
                .allocated
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
        }
    }

    /// Stack side: an empty buffer for a frame to [`EndpointQueues::send`]
    /// through `worker`'s lane: one the worker has emptied, or a new one.
    pub fn send_buffer(&self, worker: usize) -> Vec<u8> {
        match self.lane(worker).sent_free.pop() {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(self.frame_max),
        }
    }

    /// The longest frame a lane takes toward the stack.
    pub fn frame_max(&self) -> usize {
        self.frame_max
    }

    /// Stack side: queues `frame` for `worker` to switch, as sent by the
    /// endpoint. The frame back if the queue is full (the stack keeps it
    /// or drops it; TCP retransmits).
    ///
    /// # Errors
    /// The frame, when the lane's queue is full.
    pub fn send(&self, worker: usize, frame: Vec<u8>) -> Result<(), Vec<u8>> {
        self.lane(worker).from_stack.push(frame)
    }

    /// Stack side: how many more frames [`EndpointQueues::send`] takes
    /// through `worker`'s lane now (the stack polls for output only when
    /// its burst fits, so that its frames wait in its socket buffers
    /// rather than being lost here).
    pub fn send_room(&self, worker: usize) -> usize {
        let q = &self.lane(worker).from_stack;
        q.capacity().saturating_sub(q.len())
    }

    /// Frames dropped on the way to the stack, all lanes together.
    pub fn full(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.full.load(Ordering::Relaxed))
            .sum()
    }
}

/// The storage endpoints' queues of one switch configuration, by virtual
/// port: what a worker needs to hand frames to endpoints and take theirs.
///
/// The switch makes one with each configuration that has endpoints, and
/// keeps an endpoint's queues from one configuration to the next as long
/// as the endpoint (its tenant, MAC and address) stays: a stack keyed by
/// the endpoint finds its frames whatever port number the endpoint gets.
#[derive(Debug)]
pub struct EndpointTable {
    /// The first virtual port (the driver's port count).
    first: usize,
    /// Queues of ports `first`, `first + 1`, ...
    queues: Box<[Arc<EndpointQueues>]>,
}

impl EndpointTable {
    /// The queues of virtual ports `first`, `first + 1`, ... in order.
    pub fn new(first: usize, queues: Vec<Arc<EndpointQueues>>) -> EndpointTable {
        EndpointTable {
            first,
            queues: queues.into_boxed_slice(),
        }
    }

    /// The queues of virtual port `port`, if it is one.
    #[inline]
    pub fn get(&self, port: usize) -> Option<&EndpointQueues> {
        let i = port.checked_sub(self.first)?;
        self.queues.get(i).map(|q| &**q)
    }

    /// The queues of the `i`th endpoint (in port order).
    pub fn get_arc(&self, i: usize) -> Option<Arc<EndpointQueues>> {
        self.queues.get(i).cloned()
    }

    /// Every virtual port with its queues, in port order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &EndpointQueues)> {
        self.queues
            .iter()
            .enumerate()
            .map(|(i, q)| (self.first + i, &**q))
    }

    /// The number of endpoints.
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    /// True without endpoints.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pass_both_ways_per_lane() {
        let q = EndpointQueues::new(2, 4, 64);
        assert!(q.deliver(0, b"to-stack-0"));
        assert!(q.deliver(1, b"to-stack-1"));
        assert_eq!(q.receive(1).as_deref(), Some(&b"to-stack-1"[..]));
        let b = q.receive(0).unwrap();
        assert_eq!(b, b"to-stack-0");
        q.recycle(0, b);
        assert_eq!(q.receive(0), None);
        q.send(1, b"from-stack".to_vec()).unwrap();
        assert_eq!(
            q.take_sent_with(0, <[u8]>::to_vec),
            None,
            "lanes are separate"
        );
        assert_eq!(
            q.take_sent_with(1, <[u8]>::to_vec).as_deref(),
            Some(&b"from-stack"[..])
        );
        // The worker keeps the emptied buffer for the stack's next frame.
        let b = q.send_buffer(1);
        assert!(b.is_empty() && b.capacity() >= 10);
        assert_eq!(q.full(), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_never_blocks() {
        let q = EndpointQueues::new(1, 3, 64);
        let taken: Vec<bool> = (0..10).map(|i| q.deliver(0, &[i; 60])).collect();
        assert_eq!(
            taken,
            [true, true, true, false, false, false, false, false, false, false]
        );
        assert_eq!(q.full(), 7);
        // Too long for the buffers: dropped, counted.
        assert!(!q.deliver(0, &[0; 65]));
        assert_eq!(q.full(), 8);
        // Emptied and recycled, the lane takes frames again, reusing
        // the buffers: no more than 2 × depth are ever allocated.
        for round in 0..50u8 {
            while let Some(b) = q.receive(0) {
                q.recycle(0, b);
            }
            for _ in 0..3 {
                assert!(q.deliver(0, &[round; 40]));
            }
            assert!(!q.deliver(0, &[round; 40]));
        }
        assert!(q.lanes[0].allocated.load(Ordering::Relaxed) <= 6);
        let b = q.receive(0).unwrap();
        assert_eq!(b, [49; 40]);
        // The stack's queue refuses what it cannot hold, giving it back.
        for i in 0..3u8 {
            q.send(0, vec![i]).unwrap();
        }
        assert_eq!(q.send(0, vec![9]), Err(vec![9]));
    }

    #[test]
    fn buffers_held_by_the_stack_are_bounded() {
        // A stack that never gives buffers back: the lane stops at its
        // bound instead of allocating without end.
        let q = EndpointQueues::new(1, 2, 16);
        let mut held = Vec::new();
        for _ in 0..100 {
            q.deliver(0, b"x");
            while let Some(b) = q.receive(0) {
                held.push(b);
            }
        }
        assert_eq!(held.len(), 4, "2 × depth buffers at most");
        assert_eq!(q.full(), 96);
    }
}
