//! SRT through libsrt, the library ffmpeg, GStreamer and OBS use: interop with them is what
//! counts, and libsrt is the reference implementation of the protocol (retransmission,
//! TSBPD, AES key exchange). It is loaded at run time (`dlopen`) rather than linked, so that
//! building `fanout` needs no SRT headers and a machine without libsrt runs everything but
//! SRT (which then says why it is off).
//!
//! Only the calls the relay needs are bound, by hand, from `srt/srt.h` of libsrt 1.5
//! (stable C ABI): sockets, options, listen/accept with the stream-id callback, connect,
//! message send/receive, statistics. Sockets are used blocking, one thread each side of a
//! connection; libsrt runs its own sender/receiver threads underneath.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::SocketAddr;
use std::sync::OnceLock;

/// SRT's live payload (libsrt's default `SRTO_PAYLOADSIZE`): seven TS packets a message.
pub const TS_PAYLOAD: usize = 1316;

pub type SrtSocket = i32;
const SRT_ERROR: c_int = -1;
const SRT_INVALID_SOCK: SrtSocket = -1;

/// `SRT_SOCKOPT` values (srt.h).
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
#[allow(clippy::upper_case_acronyms)]
enum Opt {
    SndSyn = 1,
    RcvSyn = 2,
    Fc = 4,
    RcvBuf = 6,
    RcvTimeo = 14,
    Latency = 23,
    Passphrase = 26,
    PbKeyLen = 27,
    ConnTimeo = 36,
    StreamId = 46,
    PeerIdleTimeo = 55,
}

/// `SRT_SOCKSTATUS` values (srt.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Init,
    Opened,
    Listening,
    Connecting,
    Connected,
    Broken,
    Closing,
    Closed,
    NonExist,
}

/// `SRT_REJX_*` reasons a listener gives a refused caller (access_control.h): what ffmpeg
/// and srt-live-transmit print.
pub mod reject {
    pub const BAD_REQUEST: i32 = 1400;
    pub const UNAUTHORIZED: i32 = 1401;
    pub const NOT_FOUND: i32 = 1404;
    pub const CONFLICT: i32 = 1409;
    /// `SRT_REJX_OVERLOAD`: the server has no room (a path at its `max_readers`).
    pub const OVERLOAD: i32 = 1503;
}

/// `SRT_ETIMEOUT` (srt.h: MJ_AGAIN 6, MN_XMTIMEOUT 3).
const SRT_ETIMEOUT: c_int = 6003;
/// `SRT_EASYNCRCV`: nothing to read on a non-blocking socket.
const SRT_EASYNCRCV: c_int = 6002;

type ListenHook = unsafe extern "C" fn(*mut c_void, SrtSocket, c_int, *const libc::sockaddr, *const c_char) -> c_int;

/// The functions used, resolved once.
struct Api {
    _lib: libloading::Library,
    startup: unsafe extern "C" fn() -> c_int,
    create_socket: unsafe extern "C" fn() -> SrtSocket,
    bind: unsafe extern "C" fn(SrtSocket, *const libc::sockaddr, c_int) -> c_int,
    listen: unsafe extern "C" fn(SrtSocket, c_int) -> c_int,
    accept: unsafe extern "C" fn(SrtSocket, *mut libc::sockaddr, *mut c_int) -> SrtSocket,
    listen_callback: unsafe extern "C" fn(SrtSocket, ListenHook, *mut c_void) -> c_int,
    connect: unsafe extern "C" fn(SrtSocket, *const libc::sockaddr, c_int) -> c_int,
    close: unsafe extern "C" fn(SrtSocket) -> c_int,
    getsockname: unsafe extern "C" fn(SrtSocket, *mut libc::sockaddr, *mut c_int) -> c_int,
    getpeername: unsafe extern "C" fn(SrtSocket, *mut libc::sockaddr, *mut c_int) -> c_int,
    setsockflag: unsafe extern "C" fn(SrtSocket, c_int, *const c_void, c_int) -> c_int,
    getsockflag: unsafe extern "C" fn(SrtSocket, c_int, *mut c_void, *mut c_int) -> c_int,
    sendmsg: unsafe extern "C" fn(SrtSocket, *const c_char, c_int, c_int, c_int) -> c_int,
    recvmsg: unsafe extern "C" fn(SrtSocket, *mut c_char, c_int) -> c_int,
    getlasterror: unsafe extern "C" fn(*mut c_int) -> c_int,
    getlasterror_str: unsafe extern "C" fn() -> *const c_char,
    getsockstate: unsafe extern "C" fn(SrtSocket) -> c_int,
    setrejectreason: unsafe extern "C" fn(SrtSocket, c_int) -> c_int,
    getrejectreason: unsafe extern "C" fn(SrtSocket) -> c_int,
    rejectreason_str: unsafe extern "C" fn(c_int) -> *const c_char,
    bstats: unsafe extern "C" fn(SrtSocket, *mut PerfMon, c_int) -> c_int,
    setloglevel: unsafe extern "C" fn(c_int),
    getversion: unsafe extern "C" fn() -> u32,
}

/// Where libsrt may be: Debian's OpenSSL and GnuTLS flavours, then any.
const LIBRARIES: [&str; 4] = ["libsrt.so.1.5", "libsrt-gnutls.so.1.5", "libsrt.so", "libsrt-gnutls.so"];

fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| Error { code: 0, text: e.clone() })
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in LIBRARIES {
        // SAFETY: libsrt's initialisers are plain C++ static constructors.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind_api(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!("libsrt 1.5 not found ({}); on Debian: apt-get install libsrt1.5-openssl", tried.join("; ")))
}

fn bind_api(lib: libloading::Library) -> Result<Api, libloading::Error> {
    macro_rules! f {
        ($name:literal) => {
            // SAFETY: the types are srt.h's prototypes for these names.
            unsafe { *lib.get(concat!($name, "\0").as_bytes())? }
        };
    }
    let api = Api {
        startup: f!("srt_startup"),
        create_socket: f!("srt_create_socket"),
        bind: f!("srt_bind"),
        listen: f!("srt_listen"),
        accept: f!("srt_accept"),
        listen_callback: f!("srt_listen_callback"),
        connect: f!("srt_connect"),
        close: f!("srt_close"),
        getsockname: f!("srt_getsockname"),
        getpeername: f!("srt_getpeername"),
        setsockflag: f!("srt_setsockflag"),
        getsockflag: f!("srt_getsockflag"),
        sendmsg: f!("srt_sendmsg"),
        recvmsg: f!("srt_recvmsg"),
        getlasterror: f!("srt_getlasterror"),
        getlasterror_str: f!("srt_getlasterror_str"),
        getsockstate: f!("srt_getsockstate"),
        setrejectreason: f!("srt_setrejectreason"),
        getrejectreason: f!("srt_getrejectreason"),
        rejectreason_str: f!("srt_rejectreason_str"),
        bstats: f!("srt_bstats"),
        setloglevel: f!("srt_setloglevel"),
        getversion: f!("srt_getversion"),
        _lib: lib,
    };
    // SAFETY: no arguments; idempotent (reference counted).
    unsafe {
        (api.startup)();
        // LOG_CRIT (2): libsrt's own notices stay out of the relay's log (an accept on a
        // listener closed at shutdown is one); what fails reaches us as an error.
        (api.setloglevel)(2);
    }
    Ok(api)
}

/// Whether libsrt could be loaded, and its version ("1.5.1"), or why not.
pub fn version() -> Result<String, Error> {
    let v = unsafe { (api()?.getversion)() };
    Ok(format!("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff))
}

/// An SRT error: libsrt's code (`SRT_ERRNO`) and text.
#[derive(Debug, Clone)]
pub struct Error {
    pub code: i32,
    pub text: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Error {}

impl Error {
    pub fn is_timeout(&self) -> bool {
        self.code == SRT_ETIMEOUT || self.code == SRT_EASYNCRCV
    }
}

fn last_error(api: &Api) -> Error {
    // SAFETY: thread-local error state; the string is libsrt's, copied at once.
    unsafe {
        let code = (api.getlasterror)(std::ptr::null_mut());
        let p = (api.getlasterror_str)();
        let text =
            if p.is_null() { format!("SRT error {code}") } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
        Error { code, text }
    }
}

fn check(api: &Api, r: c_int) -> Result<c_int, Error> {
    if r == SRT_ERROR {
        Err(last_error(api))
    } else {
        Ok(r)
    }
}

/// Connection settings, on either side.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// TSBPD latency, ms (libsrt's default is 120).
    pub latency_ms: Option<u32>,
    /// AES: 10 to 79 characters; both ends must agree.
    pub passphrase: Option<String>,
    /// 16, 24 or 32 (AES-128/192/256); with a passphrase.
    pub pbkeylen: Option<u32>,
    /// A caller's stream id.
    pub streamid: Option<String>,
    /// How long a receive may wait, ms (none: forever).
    pub recv_timeout_ms: Option<u32>,
    /// How long a peer may be silent before the connection breaks, ms (libsrt: 5000).
    pub peer_idle_ms: Option<u32>,
    /// A caller's own address (none: the system's choice).
    pub local: Option<SocketAddr>,
}

/// An SRT socket, closed when dropped.
pub struct Socket {
    id: SrtSocket,
    api: &'static Api,
}

// libsrt sockets are ids into its own thread-safe tables.
unsafe impl Send for Socket {}
unsafe impl Sync for Socket {}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: our own id, closed once.
        unsafe { (self.api.close)(self.id) };
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, c_int) {
    let s = socket2::SockAddr::from(addr);
    // SAFETY: SockAddr holds a sockaddr_storage of at least `len` bytes.
    let mut out: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().cast::<u8>(), (&raw mut out).cast::<u8>(), s.len() as usize) };
    (out, s.len() as c_int)
}

/// A `sockaddr` from libsrt as a Rust address.
///
/// # Safety
/// `p` is null or points to a valid `sockaddr_in`/`sockaddr_in6`.
unsafe fn from_sockaddr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    match c_int::from((*p).sa_family) {
        libc::AF_INET => {
            let a = &*p.cast::<libc::sockaddr_in>();
            Some(SocketAddr::from((u32::from_be(a.sin_addr.s_addr).to_be_bytes(), u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            let a = &*p.cast::<libc::sockaddr_in6>();
            Some(SocketAddr::from((a.sin6_addr.s6_addr, u16::from_be(a.sin6_port))))
        }
        _ => None,
    }
}

impl Socket {
    fn new() -> Result<Self, Error> {
        let api = api()?;
        // SAFETY: no arguments.
        let id = unsafe { (api.create_socket)() };
        if id == SRT_INVALID_SOCK {
            return Err(last_error(api));
        }
        Ok(Self { id, api })
    }

    fn set_raw(&self, opt: Opt, value: &[u8]) -> Result<(), Error> {
        set_on(self.api, self.id, opt, value)
    }

    fn set_int(&self, opt: Opt, v: i32) -> Result<(), Error> {
        self.set_raw(opt, &v.to_ne_bytes())
    }

    fn set_bool(&self, opt: Opt, v: bool) -> Result<(), Error> {
        // SRT's boolean options take a C++ bool (one byte) or an int; an int works for all.
        self.set_int(opt, i32::from(v))
    }

    fn apply(&self, s: &Settings) -> Result<(), Error> {
        if let Some(l) = s.latency_ms {
            self.set_int(Opt::Latency, l as i32)?;
        }
        if let Some(p) = s.passphrase.as_deref().filter(|p| !p.is_empty()) {
            self.set_raw(Opt::Passphrase, p.as_bytes())?;
            if let Some(k) = s.pbkeylen {
                self.set_int(Opt::PbKeyLen, k as i32)?;
            }
        }
        if let Some(id) = &s.streamid {
            self.set_raw(Opt::StreamId, id.as_bytes())?;
        }
        if let Some(t) = s.recv_timeout_ms {
            self.set_int(Opt::RcvTimeo, t as i32)?;
        }
        if let Some(t) = s.peer_idle_ms {
            self.set_int(Opt::PeerIdleTimeo, t as i32)?;
        }
        Ok(())
    }

    /// Connects to a listener at `addr` (caller mode) within `timeout_ms`.
    pub fn connect(addr: SocketAddr, settings: &Settings, timeout_ms: u32) -> Result<Self, Error> {
        let s = Self::new()?;
        s.apply(settings)?;
        s.set_int(Opt::ConnTimeo, timeout_ms as i32)?;
        if let Some(local) = settings.local {
            let (l, len) = sockaddr(local);
            // SAFETY: `l` is a valid sockaddr of `len` bytes.
            check(s.api, unsafe { (s.api.bind)(s.id, (&raw const l).cast(), len) })?;
        }
        let (a, len) = sockaddr(addr);
        // SAFETY: `a` is a valid sockaddr of `len` bytes.
        let r = unsafe { (s.api.connect)(s.id, (&raw const a).cast(), len) };
        if r == SRT_ERROR {
            let mut e = last_error(s.api);
            // SAFETY: plain id lookups.
            let why = unsafe { (s.api.getrejectreason)(s.id) };
            if why != 0 {
                let text = unsafe { CStr::from_ptr((s.api.rejectreason_str)(why)) }.to_string_lossy();
                e.text = format!("{} ({why}: {text})", e.text);
            }
            return Err(e);
        }
        Ok(s)
    }

    /// Sends one message (live mode: up to 1316 bytes, seven TS packets).
    pub fn send(&self, data: &[u8]) -> Result<usize, Error> {
        // SAFETY: `data` is valid for its length; ttl -1 (forever), in order.
        let r = unsafe { (self.api.sendmsg)(self.id, data.as_ptr().cast(), data.len() as c_int, -1, 1) };
        check(self.api, r).map(|n| n as usize)
    }

    /// Receives one message into `buf` (blocking, up to the receive timeout).
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize, Error> {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { (self.api.recvmsg)(self.id, buf.as_mut_ptr().cast(), buf.len() as c_int) };
        check(self.api, r).map(|n| n as usize)
    }

    /// Makes sends return at once (an error) instead of waiting when the buffer is full.
    pub fn set_nonblocking_send(&self) -> Result<(), Error> {
        self.set_bool(Opt::SndSyn, false)
    }

    /// Sets how long a receive waits, ms.
    pub fn set_recv_timeout(&self, ms: u32) -> Result<(), Error> {
        self.set_bool(Opt::RcvSyn, true)?;
        self.set_int(Opt::RcvTimeo, ms as i32)
    }

    /// The stream id the caller gave (on an accepted socket).
    pub fn streamid(&self) -> String {
        let mut buf = [0u8; 513];
        let mut len = buf.len() as c_int;
        // SAFETY: `buf` is writable for `len` bytes.
        let r = unsafe { (self.api.getsockflag)(self.id, Opt::StreamId as c_int, buf.as_mut_ptr().cast(), &mut len) };
        if r == SRT_ERROR {
            return String::new();
        }
        String::from_utf8_lossy(&buf[..(len.max(0) as usize).min(buf.len())]).trim_end_matches('\0').to_string()
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr(self.api.getsockname)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.addr(self.api.getpeername)
    }

    fn addr(&self, f: unsafe extern "C" fn(SrtSocket, *mut libc::sockaddr, *mut c_int) -> c_int) -> Option<SocketAddr> {
        // SAFETY: the storage is large enough for any address; libsrt fills `len`.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as c_int;
        let r = unsafe { f(self.id, (&raw mut st).cast(), &mut len) };
        (r != SRT_ERROR).then(|| unsafe { from_sockaddr((&raw const st).cast()) }).flatten()
    }

    /// The buffers the handshake gave this socket: (flight window, receive buffer), packets.
    pub fn buffers(&self) -> Option<(u32, u32)> {
        let get = |opt: Opt| {
            let mut v: c_int = 0;
            let mut len = std::mem::size_of::<c_int>() as c_int;
            // SAFETY: an int-sized option into an int; libsrt writes at most `len` bytes.
            let r = unsafe { (self.api.getsockflag)(self.id, opt as c_int, (&raw mut v).cast(), &mut len) };
            (r != SRT_ERROR).then_some(v.max(0) as u32)
        };
        Some((get(Opt::Fc)?, get(Opt::RcvBuf)? / (1500 - 28)))
    }

    pub fn state(&self) -> State {
        // SAFETY: a plain id lookup.
        match unsafe { (self.api.getsockstate)(self.id) } {
            1 => State::Init,
            2 => State::Opened,
            3 => State::Listening,
            4 => State::Connecting,
            5 => State::Connected,
            6 => State::Broken,
            7 => State::Closing,
            8 => State::Closed,
            _ => State::NonExist,
        }
    }

    /// The connection's counters since it began.
    pub fn stats(&self) -> Option<Stats> {
        // SAFETY: PerfMon is srt.h's CBytePerfMon, field for field.
        let mut p: PerfMon = unsafe { std::mem::zeroed() };
        let r = unsafe { (self.api.bstats)(self.id, &mut p, 0) };
        (r != SRT_ERROR).then(|| Stats {
            packets_received: p.pkt_recv_total as u64,
            packets_sent: p.pkt_sent_total as u64,
            lost: p.pkt_rcv_loss_total.max(0) as u64,
            retransmitted: p.pkt_retrans_total.max(0) as u64,
            dropped: (p.pkt_rcv_drop_total.max(0) + p.pkt_snd_drop_total.max(0)) as u64,
            undecrypted: p.pkt_rcv_undecrypt_total.max(0) as u64,
            rtt_ms: p.ms_rtt,
        })
    }
}

/// What an SRT connection went through.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub packets_received: u64,
    pub packets_sent: u64,
    /// Packets the receiver found missing (most come again, retransmitted).
    pub lost: u64,
    /// Packets the sender sent again.
    pub retransmitted: u64,
    /// Packets given up on (too late to play, or to send).
    pub dropped: u64,
    /// Packets that did not decrypt.
    pub undecrypted: u64,
    pub rtt_ms: f64,
}

fn set_on(api: &Api, id: SrtSocket, opt: Opt, value: &[u8]) -> Result<(), Error> {
    // SAFETY: libsrt copies `value`; its length is given.
    let r = unsafe { (api.setsockflag)(id, opt as c_int, value.as_ptr().cast(), value.len() as c_int) };
    check(api, r).map(|_| ()).map_err(|e| Error { text: format!("{opt:?}: {}", e.text), ..e })
}

/// An accepted caller's buffers, where not libsrt's defaults. libsrt fills its receive loss
/// list (16 bytes a packet of the flight window: 25,600 packets, 410 KB) and its receive
/// buffer's table (8,192 packets, 128 KB) at the handshake, whether the caller sends or only
/// reads; a reader, which sends nothing but acknowledgements, needs the least of both.
/// (The send loss list is sized by the caller's own window, which the handshake carries.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buffers {
    /// The flight window, packets (`SRTO_FC`, at least 32).
    pub flight_packets: Option<u32>,
    /// The receive buffer, packets (`SRTO_RCVBUF`, 32 to the flight window).
    pub recv_packets: Option<u32>,
}

impl Buffers {
    /// What a caller that only reads needs: libsrt's least.
    pub const READER: Buffers = Buffers { flight_packets: Some(MIN_PACKETS), recv_packets: Some(MIN_PACKETS) };
}

/// libsrt's least flight window and receive buffer, packets.
pub const MIN_PACKETS: u32 = 32;

/// Sets `b` on accepted socket `ns` (in the handshake, before libsrt makes its buffers).
fn size_buffers(api: &Api, ns: SrtSocket, b: Buffers) -> Result<(), Error> {
    // (The window first: libsrt cuts the receive buffer to it.)
    if let Some(fc) = b.flight_packets {
        set_on(api, ns, Opt::Fc, &(fc.max(MIN_PACKETS) as i32).to_ne_bytes())?;
    }
    if let Some(p) = b.recv_packets {
        // In bytes of payload: a packet holds the MSS (1500) less the UDP/IP header (28).
        let bytes = p.max(MIN_PACKETS).saturating_mul(1500 - 28);
        set_on(api, ns, Opt::RcvBuf, &(bytes.min(i32::MAX as u32) as i32).to_ne_bytes())?;
    }
    Ok(())
}

/// A listening SRT socket. Each caller's stream id is put to `decide` during the handshake,
/// before anything is accepted: an `Err(reason)` (a [`reject`] code) refuses it, an `Ok`
/// says what buffers its socket gets.
pub struct Listener {
    socket: Socket,
    _hook: Box<Hook>,
}

type Decide = dyn Fn(Option<SocketAddr>, &str) -> Result<Buffers, i32> + Send + Sync;

struct Hook {
    api: &'static Api,
    decide: Box<Decide>,
}

unsafe extern "C" fn on_listen(
    opaque: *mut c_void,
    ns: SrtSocket,
    _hs_version: c_int,
    peer: *const libc::sockaddr,
    streamid: *const c_char,
) -> c_int {
    // Called on libsrt's receiver thread: no unwinding across it.
    let run = std::panic::AssertUnwindSafe(|| {
        // SAFETY: `opaque` is the Hook the Listener owns, alive while it listens.
        let hook = unsafe { &*opaque.cast::<Hook>() };
        let id = if streamid.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(streamid) }.to_string_lossy().into_owned()
        };
        let peer = unsafe { from_sockaddr(peer) };
        match (hook.decide)(peer, &id) {
            // (A size libsrt refuses leaves its default: the caller is served all the same.)
            Ok(b) => {
                let _ = size_buffers(hook.api, ns, b);
                0
            }
            Err(reason) => {
                unsafe { (hook.api.setrejectreason)(ns, reason) };
                -1
            }
        }
    });
    std::panic::catch_unwind(run).unwrap_or(-1)
}

impl Listener {
    /// Listens on `addr` with `settings` (latency, passphrase) for every accepted socket.
    pub fn bind(
        addr: SocketAddr,
        settings: &Settings,
        decide: impl Fn(Option<SocketAddr>, &str) -> Result<Buffers, i32> + Send + Sync + 'static,
    ) -> Result<Self, Error> {
        let socket = Socket::new()?;
        socket.apply(settings)?;
        let (a, len) = sockaddr(addr);
        let api = socket.api;
        // SAFETY: `a` is a valid sockaddr of `len` bytes.
        check(api, unsafe { (api.bind)(socket.id, (&raw const a).cast(), len) })?;
        let hook = Box::new(Hook { api, decide: Box::new(decide) });
        // SAFETY: the hook outlives the socket (both in the Listener; the socket drops first).
        check(api, unsafe { (api.listen_callback)(socket.id, on_listen, (&raw const *hook).cast_mut().cast()) })?;
        check(api, unsafe { (api.listen)(socket.id, 128) })?;
        Ok(Self { socket, _hook: hook })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.socket.local_addr()
    }

    /// The next connected caller (blocking).
    pub fn accept(&self) -> Result<Socket, Error> {
        let api = self.socket.api;
        // SAFETY: the storage is large enough for any address.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as c_int;
        let id = unsafe { (api.accept)(self.socket.id, (&raw mut st).cast(), &mut len) };
        if id == SRT_INVALID_SOCK {
            return Err(last_error(api));
        }
        Ok(Socket { id, api })
    }

    /// Closes the listening socket: a blocked `accept` returns an error.
    pub fn close(&self) {
        // SAFETY: our own id (closing twice is an error libsrt reports, not undefined).
        unsafe { (self.socket.api.close)(self.socket.id) };
    }
}

/// srt.h's `CBytePerfMon`, in its order (libsrt 1.5 adds fields at the end only).
#[repr(C)]
struct PerfMon {
    ms_timestamp: i64,
    pkt_sent_total: i64,
    pkt_recv_total: i64,
    pkt_snd_loss_total: c_int,
    pkt_rcv_loss_total: c_int,
    pkt_retrans_total: c_int,
    pkt_sent_ack_total: c_int,
    pkt_recv_ack_total: c_int,
    pkt_sent_nak_total: c_int,
    pkt_recv_nak_total: c_int,
    us_snd_duration_total: i64,
    pkt_snd_drop_total: c_int,
    pkt_rcv_drop_total: c_int,
    pkt_rcv_undecrypt_total: c_int,
    byte_totals: [u64; 7],
    pkt_sent: i64,
    pkt_recv: i64,
    local_ints: [c_int; 8],
    mbps_send_rate: f64,
    mbps_recv_rate: f64,
    us_snd_duration: i64,
    pkt_reorder_distance: c_int,
    pkt_rcv_avg_belated_time: f64,
    pkt_rcv_belated: i64,
    local_drops: [c_int; 3],
    local_bytes: [u64; 7],
    us_pkt_snd_period: f64,
    pkt_flow_window: c_int,
    pkt_congestion_window: c_int,
    pkt_flight_size: c_int,
    ms_rtt: f64,
    mbps_bandwidth: f64,
    byte_avail_snd_buf: c_int,
    byte_avail_rcv_buf: c_int,
    mbps_max_bw: f64,
    byte_mss: c_int,
    buffers: [c_int; 8],
    filters: [c_int; 9],
    unique: [u64; 8],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over loopback, if libsrt is here: a caller's stream id reaches the listener's
    /// decision, a refusal carries its reason to the caller, and messages go through whole,
    /// encrypted where both sides have the passphrase and refused where they differ.
    #[test]
    fn loopback_callers_are_decided_by_stream_id() {
        if let Err(e) = version() {
            eprintln!("SKIPPED (loudly): no libsrt here: {e}");
            assert!(std::env::var("CI").is_err(), "CI installs libsrt: {e}");
            return;
        }
        let secret = Settings { passphrase: Some("0123456789abc".into()), ..Settings::default() };
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), &secret, |_, id| match id {
            "publish:ok" => Ok(Buffers::default()),
            "read:ok" => Ok(Buffers::READER),
            _ => Err(reject::NOT_FOUND),
        })
        .unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let s = l.accept().unwrap();
            let id = s.streamid();
            let mut buf = [0u8; 1500];
            let n = s.recv(&mut buf).unwrap();
            let reader = l.accept().unwrap();
            (id, buf[..n].to_vec(), s.buffers(), reader.buffers(), l)
        });
        let caller = |id: &str, pass: &str| {
            let s = Settings { streamid: Some(id.into()), passphrase: Some(pass.into()), ..Settings::default() };
            Socket::connect(addr, &s, 2000)
        };
        let e = caller("publish:nothing", "0123456789abc").err().unwrap();
        assert!(e.text.contains("1404"), "{e}");
        assert!(caller("publish:ok", "wrong passphrase").is_err());
        let c = caller("publish:ok", "0123456789abc").unwrap();
        assert_eq!(c.state(), State::Connected);
        let msg = vec![0x47u8; 1316];
        c.send(&msg).unwrap();
        let stats = c.stats();
        let reader = caller("read:ok", "0123456789abc").unwrap();
        let (id, got, publisher_buffers, reader_buffers, _l) = t.join().unwrap();
        assert_eq!(id, "publish:ok");
        assert_eq!(got, msg);
        // A publisher keeps libsrt's buffers; a reader gets the least, set in the handshake.
        assert_eq!(publisher_buffers, Some((25_600, 8_192)));
        assert_eq!(reader_buffers, Some((MIN_PACKETS, MIN_PACKETS)));
        drop(reader);
        assert!(stats.is_some_and(|s| s.packets_sent <= 1 && s.rtt_ms >= 0.0), "{stats:?}");
    }
}
