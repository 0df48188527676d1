//! Headless Chromium driven over WebDriver (Debian's chromedriver), for the tests that need
//! a real browser: the dashboard, hls.js, WebRTC.

use super::wait_for;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;

/// chromedriver on a free port, killed when dropped.
pub struct Driver {
    child: std::process::Child,
    /// The WebDriver session's URL.
    pub url: String,
    /// Its turn on the machine, held until Chromium has quit.
    _turn: Turn,
}

/// The Chromium tests of a binary run side by side, but one that loads the machine most (two
/// peer connections encoding simulcast) runs alone among them: a stall of a busy machine
/// freezes a browser's picture, and those tests count freezes.
static CHROMIUM: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by a test that counts loss through a shaped link: no Chromium of its binary runs
/// meanwhile (on two busy cores, a browser's encoding starves the relay's sending and the
/// loss counted is the machine's, not the relay's).
pub fn without_browsers() -> std::sync::RwLockWriteGuard<'static, ()> {
    CHROMIUM.write().unwrap_or_else(|e| e.into_inner())
}

enum Turn {
    Shared(std::sync::RwLockReadGuard<'static, ()>),
    Alone(std::sync::RwLockWriteGuard<'static, ()>),
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Ending the session quits Chromium; killing chromedriver alone would leave it running.
        let _ = ureq::delete(&self.url).call();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both programs, or a loud skip (a failure on CI, where scripts/test installs them).
pub fn have_chromium() -> bool {
    let ok = ["chromium", "chromedriver"]
        .iter()
        .all(|p| Command::new(p).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!(
                "chromium/chromedriver missing: scripts/test installs them (apt-get install chromium chromium-driver)"
            );
        }
        eprintln!("\n*** SKIPPED: chromium and chromium-driver not installed; run scripts/test ***\n");
    }
    ok
}

impl Driver {
    pub fn start() -> Driver {
        Self::launch(Turn::Shared(CHROMIUM.read().unwrap_or_else(|e| e.into_inner())))
    }

    /// As `start`, once no other Chromium of this test binary runs, and none starts until it
    /// is dropped.
    pub fn start_alone() -> Driver {
        Self::launch(Turn::Alone(CHROMIUM.write().unwrap_or_else(|e| e.into_inner())))
    }

    fn launch(turn: Turn) -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        assert!(
            wait_for(Duration::from_secs(10), || ureq::get(&format!("{url}/status")).call().is_ok()),
            "chromedriver"
        );
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                "--autoplay-policy=no-user-gesture-required"] },
            "goog:loggingPrefs": { "browser": "ALL" } } } });
        let r: Value = ureq::post(&format!("{url}/session")).send_json(caps).unwrap().into_json().unwrap();
        let session = r["value"]["sessionId"].as_str().expect("a WebDriver session").to_string();
        Driver { child, url: format!("{url}/session/{session}"), _turn: turn }
    }

    pub fn post(&self, path: &str, body: Value) -> Value {
        match ureq::post(&format!("{}/{path}", self.url)).timeout(Duration::from_secs(30)).send_json(body) {
            Ok(r) => r.into_json::<Value>().unwrap()["value"].clone(),
            Err(ureq::Error::Status(code, r)) => panic!("{path}: {code} {}", r.into_string().unwrap_or_default()),
            Err(e) => panic!("{path}: {e}"),
        }
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub fn js(&self, script: &str) -> Value {
        self.post("execute/sync", json!({ "script": script, "args": [] }))
    }
}
