//! The dashboard: a page, its script and its style, compiled into the binary and served at
//! `/` and `/ui`. It reads `/v1/events` (server-sent status) and the API like any client.

use axum::http::header;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

/// The dashboard's routes (no state: the page holds no data, the API it calls is guarded).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let page =
        || async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], INDEX) };
    Router::new()
        .route("/", get(page))
        .route("/ui", get(page))
        .route(
            "/ui/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")],
                    SCRIPT,
                )
            }),
        )
        .route(
            "/ui/style.css",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], STYLE)
            }),
        )
}

/// Whether a path is the dashboard's (served without the token).
pub fn is_ui(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}
