//! The audit log's queue and its writer thread.
//!
//! The queue is bounded by bytes, not records, so a burst of large records cannot hold more
//! memory than [`QUEUE_BYTES`]. Records count against it until they are written, including
//! the batch the writer is busy with. The writer is a dedicated OS thread: a sink that stalls
//! (a full disk, a pipe nobody reads) stops that thread and nothing else. Producers only ever
//! take the queue's lock for a push, which the writer holds for a swap, never across I/O; when
//! the queue is full the record is dropped and counted. Traffic never waits for the audit log.
//!
//! Promptness: the writer wakes on every push and writes each batch through to the kernel
//! (`write(2)`, then nothing is buffered in the process), so a record survives the process
//! crashing right after it was made. A file is also synced to its disk ([`SYNC_INTERVAL`]),
//! so that it survives the machine crashing: at once when nothing was synced for that long,
//! else at most that much later, never more than once per interval, and always from the
//! writer's own thread.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics::Counter;

/// Bytes of records queued or being written; past it new records are dropped and counted.
pub const QUEUE_BYTES: usize = 4 << 20;

/// How long shutdown waits for the writer to write what is queued.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A file's records reach its disk (`fdatasync`) at most this long after they were written.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// What one queued line costs against [`QUEUE_BYTES`]: its text and its place in the queue.
fn cost(line: &str) -> usize {
    line.len() + 1 + std::mem::size_of::<String>()
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<String>,
    /// The cost of `lines` and of the batch being written.
    bytes: usize,
    /// Shutdown began: write what is queued, then stop.
    stopping: bool,
    /// The writer stopped (shutdown, or a write error): nothing more is taken.
    closed: bool,
}

/// The queue between producers and the writer thread.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    ready: Condvar,
    capacity: usize,
}

/// Why [`Queue::push`] did not take a line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    Full,
    Closed,
}

impl Queue {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::default(),
            ready: Condvar::new(),
            capacity,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `line` unless that would pass the capacity or the writer is gone. Never waits
    /// for the writer: its lock is only held for a swap.
    pub(crate) fn push(&self, line: String) -> Result<(), Refused> {
        let cost = cost(&line);
        let mut state = self.state();
        if state.closed {
            return Err(Refused::Closed);
        }
        if state.bytes + cost > self.capacity {
            return Err(Refused::Full);
        }
        state.bytes += cost;
        state.lines.push(line);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Asks the writer to write what is queued and stop.
    fn stop(&self) {
        self.state().stopping = true;
        self.ready.notify_one();
    }

    /// The next batch, waiting for one; `None` once stopping with nothing left (the queue is
    /// then closed).
    #[cfg(test)]
    fn next_batch(&self) -> Option<Vec<String>> {
        match self.next_batch_until(None) {
            Next::Batch(batch) => Some(batch),
            Next::Idle | Next::Stopped => None,
        }
    }

    /// The next batch, waiting for one until `deadline` (forever without one).
    fn next_batch_until(&self, deadline: Option<Instant>) -> Next {
        let mut state = self.state();
        while state.lines.is_empty() && !state.stopping {
            state = match deadline {
                None => self.ready.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return Next::Idle;
                    };
                    self.ready
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        if state.lines.is_empty() {
            state.closed = true;
            return Next::Stopped;
        }
        Next::Batch(std::mem::take(&mut state.lines))
    }

    /// The batch of `bytes` is written (or lost): its room is free again.
    fn release(&self, bytes: usize) {
        let mut state = self.state();
        state.bytes = state.bytes.saturating_sub(bytes);
    }

    /// The writer failed: later records are refused; returns how many queued ones are lost.
    fn close(&self) -> usize {
        let mut state = self.state();
        state.closed = true;
        let lost = state.lines.len();
        state.lines.clear();
        state.bytes = 0;
        lost
    }
}

/// What the writer waits for.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Batch(Vec<String>),
    /// The deadline passed with nothing queued.
    Idle,
    /// Stopping, and nothing is left.
    Stopped,
}

/// The writing half, before it runs: [`spawn`](Self::spawn) starts its thread.
pub struct AuditWriter {
    pub(crate) queue: Arc<Queue>,
    pub(crate) out: Box<dyn std::io::Write + Send>,
    /// The file behind `out`, synced to its disk; `None` for standard output.
    pub(crate) sync: Option<std::fs::File>,
    pub(crate) written: Arc<Counter>,
    pub(crate) dropped: Arc<Counter>,
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditWriter").finish_non_exhaustive()
    }
}

/// A running writer thread; [`finish`](Self::finish) stops it after it wrote what is queued.
#[derive(Debug)]
pub struct AuditTask {
    queue: Arc<Queue>,
    /// `None` when the thread could not be started (the queue is then closed).
    thread: Option<std::thread::JoinHandle<()>>,
    /// Closed when the thread ends, so that shutdown can wait for it with a deadline.
    done: tokio::sync::oneshot::Receiver<()>,
}

impl AuditWriter {
    /// Starts the writer on its own OS thread. If the system cannot start one, the error is
    /// logged and every record is dropped and counted.
    pub fn spawn(self) -> AuditTask {
        let queue = self.queue.clone();
        let dropped = self.dropped.clone();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                self.run();
                drop(done_tx);
            });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                dropped.add(queue.close() as u64);
                tracing::error!(%error, "cannot start the audit log's writer thread; records are dropped (tether_audit_records_dropped_total)");
                None
            }
        };
        AuditTask {
            queue,
            thread,
            done,
        }
    }

    /// Writes batches until the queue stops. A write error ends the writer: it is logged,
    /// and the records of the failed batch and every later one are dropped and counted.
    fn run(self) {
        let Self {
            queue,
            out,
            sync,
            written,
            dropped,
        } = self;
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
        let mut disk = sync.map(Disk::new);
        loop {
            let deadline = disk.as_ref().and_then(Disk::deadline);
            let batch = match queue.next_batch_until(deadline) {
                Next::Batch(batch) => batch,
                Next::Idle => {
                    if let Some(disk) = &mut disk {
                        disk.sync();
                    }
                    continue;
                }
                Next::Stopped => break,
            };
            let bytes: usize = batch.iter().map(|line| cost(line)).sum();
            let count = batch.len() as u64;
            let result = write_batch(&mut out, &batch);
            queue.release(bytes);
            match result {
                Ok(()) => written.add(count),
                Err(error) => {
                    let lost = queue.close() as u64;
                    dropped.add(count + lost);
                    tracing::error!(%error, "the audit log could not be written; later records are dropped (tether_audit_records_dropped_total)");
                    return;
                }
            }
            if let Some(disk) = &mut disk {
                disk.written();
            }
        }
        if let Some(disk) = &mut disk
            && disk.dirty
        {
            disk.sync();
        }
    }
}

/// When the file was last synced to its disk, and whether it holds records written since.
struct Disk {
    file: std::fs::File,
    last_sync: Option<Instant>,
    dirty: bool,
}

impl Disk {
    fn new(file: std::fs::File) -> Self {
        Self {
            file,
            last_sync: None,
            dirty: false,
        }
    }

    /// A batch was written: synced now when the last sync is [`SYNC_INTERVAL`] old, else by
    /// [`deadline`](Self::deadline).
    fn written(&mut self) {
        self.dirty = true;
        if self
            .last_sync
            .is_none_or(|at| at.elapsed() >= SYNC_INTERVAL)
        {
            self.sync();
        }
    }

    /// When the records written since the last sync must be synced.
    fn deadline(&self) -> Option<Instant> {
        self.dirty.then(|| {
            self.last_sync
                .map_or_else(Instant::now, |at| at + SYNC_INTERVAL)
        })
    }

    /// A failed sync is logged and not retried until more is written: the records are
    /// written (a process crash keeps them), only not yet on the disk.
    fn sync(&mut self) {
        if let Err(error) = self.file.sync_data() {
            tracing::warn!(%error, "cannot sync the audit log to its disk");
        }
        self.last_sync = Some(Instant::now());
        self.dirty = false;
    }
}

fn write_batch(out: &mut impl std::io::Write, batch: &[String]) -> std::io::Result<()> {
    for line in batch {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

impl AuditTask {
    /// Stops the writer once what is queued is written (its owner calls this last, after
    /// every connection that might still write a record has ended), waiting at most
    /// [`DRAIN_TIMEOUT`]: a stalled sink must not hold up shutdown.
    pub async fn finish(self) {
        let Some(thread) = self.thread else {
            return;
        };
        self.queue.stop();
        match tokio::time::timeout(DRAIN_TIMEOUT, self.done).await {
            Ok(_) => {
                if thread.join().is_err() {
                    tracing::error!("the audit writer failed");
                }
            }
            Err(_) => tracing::warn!(
                timeout = ?DRAIN_TIMEOUT,
                "the audit log's sink did not take the last records in time; leaving them unwritten"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_by_bytes_and_frees_room_once_written() {
        let line = "x".repeat(1000);
        let queue = Queue::new(10 * cost(&line));
        for _ in 0..10 {
            queue.push(line.clone()).unwrap();
        }
        assert_eq!(queue.push(line.clone()), Err(Refused::Full));
        // A small record still fits nowhere: the bound is the bytes, whatever the count.
        assert_eq!(queue.push("y".into()), Err(Refused::Full));
        let batch = queue.next_batch().unwrap();
        assert_eq!(batch.len(), 10);
        // Taken but not yet written: still counted.
        assert_eq!(queue.push(line.clone()), Err(Refused::Full));
        queue.release(batch.iter().map(|l| cost(l)).sum());
        queue.push(line).unwrap();
        queue.stop();
        assert_eq!(queue.next_batch().map(|b| b.len()), Some(1));
        assert_eq!(queue.next_batch(), None);
        assert_eq!(queue.push("late".into()), Err(Refused::Closed));
    }

    #[test]
    fn a_file_is_synced_at_once_then_at_most_once_per_interval() {
        let file = tempfile::tempfile().unwrap();
        let mut disk = Disk::new(file);
        assert_eq!(disk.deadline(), None, "nothing written, nothing to sync");
        // The first batch after a quiet spell is synced at once.
        disk.written();
        assert!(!disk.dirty);
        let first = disk.last_sync.unwrap();
        assert_eq!(disk.deadline(), None);
        // One right after waits for the interval: a burst costs one sync per second.
        disk.written();
        assert!(disk.dirty);
        assert_eq!(disk.last_sync, Some(first));
        assert_eq!(disk.deadline(), Some(first + SYNC_INTERVAL));
        disk.sync();
        assert_eq!(disk.deadline(), None);
    }

    #[test]
    fn the_writer_wakes_by_its_deadline_when_nothing_comes() {
        let queue = Queue::new(1024);
        let started = Instant::now();
        let deadline = started + Duration::from_millis(50);
        assert_eq!(queue.next_batch_until(Some(deadline)), Next::Idle);
        assert!(Instant::now() >= deadline);
        queue.push("x".into()).unwrap();
        assert_eq!(
            queue.next_batch_until(Some(started)),
            Next::Batch(vec!["x".into()])
        );
    }
}
