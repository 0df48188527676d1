//! A player's batch written whole in as few system calls as the socket takes: its own bytes
//! and the path's shared buffers side by side in one vectored write, never copied together.

use std::io::IoSlice;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// A player's (or an RTSP client's) connection, plain or under TLS: its TCP socket.
pub trait OnTcp {
    fn tcp(&self) -> &tokio::net::TcpStream;
}

impl OnTcp for tokio::net::TcpStream {
    fn tcp(&self) -> &tokio::net::TcpStream {
        self
    }
}

impl OnTcp for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn tcp(&self) -> &tokio::net::TcpStream {
        self.get_ref().0
    }
}

/// Sets `io`'s send buffer to `bytes` (a second of its stream, as for HTTP TS sinks): a player
/// that stops reading holds that much, not the kernel's autotuned megabytes of stale stream,
/// before the path's channel laps it and it skips to the live edge.
pub fn size_send_buffer(io: &impl OnTcp, bytes: usize) {
    let _ = socket2::SockRef::from(io.tcp()).set_send_buffer_size(bytes);
}

/// Parts one batch holds at most: writev takes 1,024.
pub const MAX_PARTS: usize = 512;

/// Writes `parts` whole, in order.
pub async fn write_parts<'a, W: AsyncWrite + Unpin>(
    io: &mut W,
    parts: impl IntoIterator<Item = &'a [u8]>,
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice> = parts.into_iter().filter(|p| !p.is_empty()).map(IoSlice::new).collect();
    let mut left = &mut slices[..];
    while !left.is_empty() {
        let n = io.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most 7 bytes a call.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(7);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(7 - n);
                self.0.extend_from_slice(&b[..k]);
                n += k;
                if n == 7 {
                    break;
                }
            }
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn parts_arrive_whole_and_in_order_through_short_writes() {
        let parts: [&[u8]; 4] = [b"abc", b"", b"defghijklmnop", b"q"];
        let mut w = Trickle(Vec::new());
        write_parts(&mut w, parts).await.unwrap();
        assert_eq!(w.0, b"abcdefghijklmnopq");
    }
}
