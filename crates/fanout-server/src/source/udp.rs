//! `udp`: datagrams received on an address (a multicast group joined on an interface): the
//! session's own socket, where the `kernel` path's program clones.

use super::{Ctx, Started};
use crate::error::RelayError;
use std::net::{Ipv4Addr, SocketAddr};

pub fn start(addr: SocketAddr, interface: Option<Ipv4Addr>, cx: &Ctx) -> Result<Started, RelayError> {
    fanout_io::bind_udp_source(addr, interface)
        .and_then(|s| cx.session.attach_udp(s))
        .map_err(|e| RelayError::Conflict(format!("cannot receive on udp {addr}: {e}")))?;
    Ok(Started::plain(Vec::new()))
}
