//! The dashboard: a page, its script and its style, compiled into the binary and served at
//! `/` and `/ui`. It reads `/v1/events` (server-sent status) and the API like any client.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

/// One of the files, revalidated on every load (a new binary may bring a new one).
fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
}

/// The dashboard's routes (no state: the page holds no data, the API it calls is guarded).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let page = || async { file("text/html; charset=utf-8", INDEX) };
    Router::new()
        .route("/", get(page))
        .route("/ui", get(page))
        .route("/ui/app.js", get(|| async { file("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/ui/style.css", get(|| async { file("text/css; charset=utf-8", STYLE) }))
}

/// Whether a path is the dashboard's (served without the token).
pub fn is_ui(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_is_served_without_the_token_and_names_its_files() {
        for p in ["/", "/ui", "/ui/app.js", "/ui/style.css"] {
            assert!(super::is_ui(p), "{p}");
        }
        for p in ["/v1/sessions", "/uix", "/metrics", "/cam/whep"] {
            assert!(!super::is_ui(p), "{p}");
        }
        assert!(super::INDEX.contains("/ui/app.js") && super::INDEX.contains("/ui/style.css"));
    }
}
