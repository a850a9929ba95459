//! Driving one stream: its reader hands packets to the table, its writer drains the table's
//! outbox into the stream's [`Transport`], and deadlines fire on the reader's timer.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tether_session::{Role, Violation};
use tokio_util::task::AbortOnDropHandle;

use crate::link::{Direction, Link, Waiter};
use crate::transport::{Reader, Transport, TransportError, Writer};

/// Largest batch the writer encodes before flushing.
const BATCH_BYTES: usize = 256 * 1024;
/// How long a stream ended on purpose waits for its writer to end it cleanly, and then for
/// the peer to end its side.
const FINISH_TIMEOUT: Duration = Duration::from_secs(1);

/// How one transport of a stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportEnd {
    /// The transport broke (reading or writing failed, its connection went away): a
    /// resumable session may go on over another.
    Broken(String),
    /// The stream is over: the peer ended it or broke the protocol, or its owner stopped it.
    Final(String),
}

impl TransportEnd {
    pub fn reason(&self) -> &str {
        match self {
            Self::Broken(reason) | Self::Final(reason) => reason,
        }
    }
}

impl Link {
    /// Runs one transport of the stream: its packets go to the table and the table's
    /// outbox to it, until it ends or `stop` resolves. The table is left as it is: the
    /// caller closes it, or suspends it to resume on another transport.
    pub fn run_transport<F: Future<Output = TransportEnd>>(
        self: &Arc<Self>,
        transport: Transport,
        stop: F,
    ) -> impl Future<Output = TransportEnd> {
        // Not an async fn, so that what the returned future holds for the transport's life
        // is held once: an async fn keeps room for each argument beside the copy its body
        // takes. The writing half goes to its task now and `stop` to the heap (a caller's is
        // often the largest part: the server's is 1.5 KiB). Dropped early, the returned
        // future still ends the writer.
        let (mut receiver, sender) = transport.into_split();
        let (finish, finish_requested) = tokio::sync::oneshot::channel();
        let mut writer =
            AbortOnDropHandle::new(tokio::spawn(write(self.clone(), sender, finish_requested)));
        let mut stop = Box::pin(stop);
        async move {
            let sleep = tokio::time::sleep(Duration::ZERO);
            let mut sleep = pin!(sleep);
            let peer = match self.role() {
                Role::Server => "agent",
                Role::Agent => "server",
            };
            let (mut parked, mut next) = self.reader_state();
            let mut armed = None;
            let mut writer_done = false;
            let end = loop {
                if next != armed {
                    armed = next;
                    if let Some(at) = next {
                        sleep.as_mut().reset(at.into());
                    }
                }
                tokio::select! {
                    () = &mut sleep, if armed.is_some() => {
                        self.update(|s, now| s.handle_timeout(now));
                        armed = None;
                        (parked, next) = self.reader_state();
                    }
                    () = self.reader.notified() => (parked, next) = self.reader_state(),
                    packet = receiver.next(), if !parked => match packet {
                        Some(Ok(packet)) => {
                            self.hooks().on_packet(Direction::In, &packet);
                            let handled = self.update(|s, now| {
                                s.handle_packet(now, packet).map(|()| (s.is_parked(), s.next_timeout()))
                            });
                            match handled {
                                Ok(state) => (parked, next) = state,
                                Err(violation) => break violated(&violation),
                            }
                        }
                        Some(Err(e)) if e.is_bad_packet() => {
                            self.hooks().on_bad_packet(&e);
                            self.update(|s, _| s.count_undecodable());
                        }
                        // A peer that stops or restarts resets its streams with CANCEL: no
                        // failure, though its connections wait for a resume all the same.
                        Some(Err(e)) if e.is_cancelled() => {
                            self.hooks().on_stream_error(Direction::In, &e);
                            break TransportEnd::Broken(format!(
                                "{peer} cancelled the stream (it stopped, restarted or gave it up)"
                            ));
                        }
                        Some(Err(e)) => {
                            self.hooks().on_stream_error(Direction::In, &e);
                            break TransportEnd::Broken(format!("{peer} stream failed: {e}"));
                        }
                        None => break TransportEnd::Final(format!("{peer} closed the stream")),
                    },
                    result = &mut writer => {
                        writer_done = true;
                        break match result {
                            Ok(Err(e)) => {
                                self.hooks().on_stream_error(Direction::Out, &e);
                                TransportEnd::Broken(format!("writing to {peer} failed: {e}"))
                            }
                            _ => TransportEnd::Final("stream writer ended".to_owned()),
                        };
                    }
                    end = &mut stop => {
                        if matches!(end, TransportEnd::Final(_)) {
                            writer_done = finish_cleanly(&mut writer, finish, &mut receiver).await;
                        }
                        break end;
                    }
                }
            };
            // A join handle that returned its output must not be polled again.
            if !writer_done {
                writer.abort();
                let _ = writer.await;
            }
            self.forget(Waiter::Writer);
            end
        }
    }

    /// Ends every dial and connection of the stream with `reason`, and wakes their owners.
    pub fn close(self: &Arc<Self>, reason: &str) {
        self.update(|s, now| s.close_stream(now, reason));
        self.forget(Waiter::Writer);
        self.wake_all();
    }
}

/// The end of a stream whose peer broke the protocol. Only a bug in one of the two ends does
/// this: it is logged at error level, for an operator (and the soak, which counts error
/// lines) to hear of it.
fn violated(violation: &Violation) -> TransportEnd {
    tracing::error!(%violation, "the peer broke the protocol; the stream ends (a bug in the peer or in tether: report this line with the peer's version)");
    TransportEnd::Final(format!("protocol violation: {violation}"))
}

/// Ends a transport on purpose: the peer hears a clean end of the stream, not a reset it
/// would take for a broken transport to resume. Returns whether the writer task ended (its
/// handle must not be polled again then).
async fn finish_cleanly(
    writer: &mut AbortOnDropHandle<Result<(), TransportError>>,
    finish: tokio::sync::oneshot::Sender<()>,
    receiver: &mut Reader,
) -> bool {
    let _ = finish.send(());
    let deadline = tokio::time::Instant::now() + FINISH_TIMEOUT;
    let finished = tokio::time::timeout_at(deadline, &mut *writer).await;
    if matches!(finished, Ok(Ok(Ok(())))) {
        // The end may still wait in the transport's own buffers, and an h2 stream whose
        // every handle is gone is reset with CANCEL, which discards the END_STREAM not yet
        // written: the agent's clean end would reach the server as a cancel. The receiving
        // half is held until the peer ends its side, within the bound.
        let _ = tokio::time::timeout_at(deadline, async {
            while let Some(Ok(_)) = receiver.next().await {}
        })
        .await;
    }
    finished.is_ok()
}

/// The stream's one writer: coalesces whatever is queued into one transport write. Ends the
/// stream cleanly when `finish` fires. Not an async fn, and its clean end boxed: it is a task
/// of its own for every stream, and would otherwise keep room for its arguments twice and for
/// the end's state (most of it) for the stream's life.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice for the stream's life"
)]
fn write(
    link: Arc<Link>,
    mut sender: Writer,
    mut finish: tokio::sync::oneshot::Receiver<()>,
) -> impl Future<Output = Result<(), TransportError>> + Send + 'static {
    async move {
        let mut batch = Vec::new();
        let mut releases = Vec::new();
        let mut may_finish = true;
        loop {
            let more = tokio::select! {
                biased;
                asked = &mut finish, if may_finish => {
                    if asked.is_ok() {
                        return Box::pin(sender.finish()).await;
                    }
                    may_finish = false;
                    continue;
                }
                more = poll_fn(|cx| link.poll_transmit(cx, &mut batch, BATCH_BYTES)) => more,
                () = sender.wants_flush() => {
                    sender.flush().await?;
                    continue;
                }
            };
            if !more {
                break;
            }
            for item in batch.drain(..) {
                sender.buffer(&item.packet);
                link.hooks().on_packet(Direction::Out, &item.packet);
                releases.extend(item.release);
            }
            sender.flush().await?;
            if !releases.is_empty() {
                link.update(|s, _| {
                    for (id, cost) in releases.drain(..) {
                        s.transmitted(id, cost);
                    }
                });
            }
        }
        Ok(())
    }
}
