//! RTSP over HTTP (Apple's QuickTime tunnelling, for networks that pass only HTTP): a client
//! opens a `GET`, down which the server's answers and interleaved media go as plain RTSP, and
//! a `POST` with the same `x-sessioncookie`, whose body carries its requests in base64. The
//! two sockets joined are one RTSP connection ([`Tunnel`]); the HTTP face pairs them
//! ([`Pairing`]), the RTSP face serves the connection.

use fanout_proto::http::Base64Stream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A tunnel's two sockets as one stream: reads are the POST body decoded, writes go down the
/// GET's response.
pub struct Tunnel {
    down: TcpStream,
    up: TcpStream,
    decoder: Base64Stream,
    raw: Box<[u8]>,
    plain: Vec<u8>,
    at: usize,
}

impl Tunnel {
    pub fn new(down: TcpStream, up: TcpStream) -> Self {
        Self { down, up, decoder: Base64Stream::default(), raw: vec![0; 16 * 1024].into(), plain: Vec::new(), at: 0 }
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.at < me.plain.len() {
                let n = buf.remaining().min(me.plain.len() - me.at);
                buf.put_slice(&me.plain[me.at..me.at + n]);
                me.at += n;
                return Poll::Ready(Ok(()));
            }
            me.plain.clear();
            me.at = 0;
            let mut rb = ReadBuf::new(&mut me.raw);
            match Pin::new(&mut me.up).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if let Err(e) = me.decoder.push(&me.raw[..n], &mut me.plain) {
                        return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.0)));
                    }
                }
                other => return other,
            }
        }
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.down).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.down).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.down).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.down).poll_shutdown(cx)
    }
}

impl crate::write::OnTcp for Tunnel {
    fn tcp(&self) -> &TcpStream {
        &self.down
    }
}

/// GETs waiting for their POST, by cookie.
#[derive(Default)]
pub struct Pairing {
    waiting: Mutex<HashMap<String, tokio::sync::oneshot::Sender<TcpStream>>>,
}

/// At most this many GETs wait for their POST at once (each holds an API connection slot
/// meanwhile, for at most `request_timeout_s`).
const MAX_WAITING: usize = 1024;

impl Pairing {
    /// A GET with `cookie` waits for its POST; `None` if the cookie is taken or too many wait.
    pub fn wait(&self, cookie: &str) -> Option<Waiting<'_>> {
        let mut w = self.waiting.lock();
        w.retain(|_, tx| !tx.is_closed());
        if w.contains_key(cookie) || w.len() >= MAX_WAITING {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.insert(cookie.to_string(), tx);
        Some(Waiting { pairing: self, cookie: cookie.to_string(), rx })
    }

    /// A POST with `cookie`: handed to its GET, or given back if none waits.
    pub fn post(&self, cookie: &str, up: TcpStream) -> Result<(), TcpStream> {
        match self.waiting.lock().remove(cookie) {
            Some(tx) => tx.send(up),
            None => Err(up),
        }
    }
}

/// A GET's wait for its POST; forgotten when dropped.
pub struct Waiting<'a> {
    pairing: &'a Pairing,
    cookie: String,
    rx: tokio::sync::oneshot::Receiver<TcpStream>,
}

impl Waiting<'_> {
    pub async fn post(&mut self) -> Option<TcpStream> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pairing.waiting.lock().remove(&self.cookie);
    }
}
