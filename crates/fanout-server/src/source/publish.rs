//! `publish`: RTSP, RTMP and SRT publishers push to the path (served by `crate::rtsp`,
//! `crate::rtmp`, `crate::srt`); their tracks are fed by `crate::publish::Publisher`.

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use std::sync::Arc;

pub fn start(cx: &Ctx, takeover: bool) -> Result<Started, RelayError> {
    let p = crate::publish::Publisher::new(cx.name, cx.session.clone(), takeover)
        .map_err(|e| RelayError::Internal(format!("publish source: {e}")))?;
    cx.session.set_source_kind(
        if takeover { "publish (RTSP, RTMP, SRT; takeover)" } else { "publish (RTSP, RTMP, SRT)" }.into(),
    );
    Ok(Started { feeder: Feeder::Publisher(Arc::new(p)), tasks: Vec::new() })
}
