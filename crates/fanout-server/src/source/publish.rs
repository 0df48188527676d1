//! `publish`: RTSP publishers push to `rtsp://relay/{name}` (ANNOUNCE/RECORD, served by
//! `crate::rtsp`); their tracks are fed by `crate::publish::Publisher`.

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use std::sync::Arc;

pub fn start(cx: &Ctx) -> Result<Started, RelayError> {
    let p = crate::publish::Publisher::new(cx.name, cx.session.clone())
        .map_err(|e| RelayError::Internal(format!("publish source: {e}")))?;
    cx.session.set_source_kind("rtsp publish (ANNOUNCE/RECORD)".into());
    Ok(Started { feeder: Feeder::Publisher(Arc::new(p)), tasks: Vec::new() })
}
