//! A stream's dials and connections as introspection shows them, the same for server and
//! agent: one snapshot of the table, taken only when someone asks.

use std::time::Instant;

use tether_observe::introspect::ConnectionView;
use tether_proto::DialId;

use crate::link::Link;

impl Link {
    /// Every pending dial and connection of this stream. `base` fills in what the caller
    /// knows about a dial (its ID, the table's destination and when it started): the view's
    /// identity fields; the table's numbers are added here.
    pub fn connection_views(
        &self,
        base: impl Fn(DialId, String, Instant) -> ConnectionView,
    ) -> Vec<ConnectionView> {
        let (conns, pending) = self.inspect(|table| {
            (
                table.connections().collect::<Vec<_>>(),
                table.pending_dials(),
            )
        });
        let pending = pending.into_iter().map(|dial| ConnectionView {
            state: "pending".into(),
            ..base(dial.dial_id, dial.address, dial.started)
        });
        let open = conns.into_iter().map(|conn| ConnectionView {
            connect_id: Some(conn.id.0),
            state: conn.state.as_str().into(),
            bytes_received: conn.bytes_from_peer,
            bytes_sent: conn.bytes_to_peer,
            credit: conn.window,
            queued_bytes: conn.queued as u64,
            queue_limit: conn.limit as u64,
            ..base(conn.dial_id, conn.address, conn.opened_at)
        });
        pending.chain(open).collect()
    }
}
