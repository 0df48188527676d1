//! libopus (loaded at run time: `libopus.so.0`, Debian's `libopus0`, which ffmpeg and
//! browsers' stacks already bring): an encoder, and a decoder for checking its output.

use crate::MediaError;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

struct Api {
    _lib: libloading::Library,
    encoder_create: unsafe extern "C" fn(i32, c_int, c_int, *mut c_int) -> *mut c_void,
    encoder_ctl: unsafe extern "C" fn(*mut c_void, c_int, ...) -> c_int,
    encode_float: unsafe extern "C" fn(*mut c_void, *const f32, c_int, *mut u8, i32) -> i32,
    encoder_destroy: unsafe extern "C" fn(*mut c_void),
    decoder_create: unsafe extern "C" fn(i32, c_int, *mut c_int) -> *mut c_void,
    decode_float: unsafe extern "C" fn(*mut c_void, *const u8, i32, *mut f32, c_int, c_int) -> c_int,
    decoder_destroy: unsafe extern "C" fn(*mut c_void),
}

const LIBRARIES: [&str; 2] = ["libopus.so.0", "libopus.so"];
/// `OPUS_APPLICATION_AUDIO`: music and mixed content, as a camera's sound is.
const APPLICATION_AUDIO: c_int = 2049;
const SET_BITRATE: c_int = 4002;
/// An Opus packet is at most this (RFC 6716 §3.4: 1275 bytes a frame).
const MAX_PACKET: usize = 1500;

fn api() -> Result<&'static Api, MediaError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| MediaError(e.clone()))
}

/// Whether libopus could be loaded (and why not).
pub fn available() -> Result<(), MediaError> {
    api().map(|_| ())
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in LIBRARIES {
        // SAFETY: libopus has no initialisers with side effects.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!("libopus not found ({}); on Debian: apt-get install libopus0", tried.join("; ")))
}

fn bind(lib: libloading::Library) -> Result<Api, libloading::Error> {
    macro_rules! f {
        ($name:literal) => {
            // SAFETY: the types are opus.h's prototypes for these names.
            unsafe { *lib.get(concat!($name, "\0").as_bytes())? }
        };
    }
    Ok(Api {
        encoder_create: f!("opus_encoder_create"),
        encoder_ctl: f!("opus_encoder_ctl"),
        encode_float: f!("opus_encode_float"),
        encoder_destroy: f!("opus_encoder_destroy"),
        decoder_create: f!("opus_decoder_create"),
        decode_float: f!("opus_decode_float"),
        decoder_destroy: f!("opus_decoder_destroy"),
        _lib: lib,
    })
}

fn failed(what: &str, code: c_int) -> MediaError {
    MediaError(format!("libopus {what}: error {code}"))
}

/// A 48 kHz Opus encoder of 1 or 2 channels.
pub struct Encoder {
    api: &'static Api,
    state: *mut c_void,
    channels: usize,
    out: Vec<u8>,
}

// SAFETY: the encoder state is used by one owner at a time (`&mut self`).
unsafe impl Send for Encoder {}

impl Encoder {
    pub fn new(channels: usize) -> Result<Self, MediaError> {
        let api = api()?;
        let mut err = 0;
        // SAFETY: valid rate, channels and application; `err` is written.
        let state = unsafe { (api.encoder_create)(48_000, channels as c_int, APPLICATION_AUDIO, &mut err) };
        if state.is_null() || err != 0 {
            return Err(failed("encoder_create", err));
        }
        Ok(Self { api, state, channels, out: vec![0; MAX_PACKET] })
    }

    pub fn set_bitrate(&mut self, bps: i32) -> Result<(), MediaError> {
        // SAFETY: OPUS_SET_BITRATE takes one opus_int32.
        let r = unsafe { (self.api.encoder_ctl)(self.state, SET_BITRATE, bps) };
        if r == 0 {
            Ok(())
        } else {
            Err(failed("set bitrate", r))
        }
    }

    /// One packet of a frame of `pcm` (interleaved; 960 samples a channel: 20 ms).
    pub fn encode(&mut self, pcm: &[f32]) -> Result<Vec<u8>, MediaError> {
        let frame = (pcm.len() / self.channels) as c_int;
        // SAFETY: `pcm` holds `frame` samples a channel; `out` has its length.
        let n = unsafe {
            (self.api.encode_float)(self.state, pcm.as_ptr(), frame, self.out.as_mut_ptr(), self.out.len() as i32)
        };
        if n < 0 {
            return Err(failed("encode", n));
        }
        Ok(self.out[..n as usize].to_vec())
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // SAFETY: made by encoder_create, destroyed once.
        unsafe { (self.api.encoder_destroy)(self.state) }
    }
}

/// A 48 kHz Opus decoder (to check what the encoder made).
pub struct Decoder {
    api: &'static Api,
    state: *mut c_void,
    channels: usize,
}

// SAFETY: as the encoder.
unsafe impl Send for Decoder {}

impl Decoder {
    pub fn new(channels: usize) -> Result<Self, MediaError> {
        let api = api()?;
        let mut err = 0;
        // SAFETY: as encoder_create.
        let state = unsafe { (api.decoder_create)(48_000, channels as c_int, &mut err) };
        if state.is_null() || err != 0 {
            return Err(failed("decoder_create", err));
        }
        Ok(Self { api, state, channels })
    }

    /// Appends the samples of `packet` (interleaved) to `out`.
    pub fn decode(&mut self, packet: &[u8], out: &mut Vec<f32>) -> Result<(), MediaError> {
        let max = 5760; // 120 ms a channel: the longest an Opus packet holds.
        let at = out.len();
        out.resize(at + max * self.channels, 0.0);
        // SAFETY: `out` has room for `max` samples a channel past `at`.
        let n = unsafe {
            (self.api.decode_float)(
                self.state,
                packet.as_ptr(),
                packet.len() as i32,
                out[at..].as_mut_ptr(),
                max as c_int,
                0,
            )
        };
        if n < 0 {
            out.truncate(at);
            return Err(failed("decode", n));
        }
        out.truncate(at + n as usize * self.channels);
        Ok(())
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: made by decoder_create, destroyed once.
        unsafe { (self.api.decoder_destroy)(self.state) }
    }
}
