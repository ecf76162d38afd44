//! Kiln's web UI as static assets compiled into the binary.
//!
//! The UI is plain HTML, CSS and JavaScript modules written by hand, so
//! neither users nor CI need a JavaScript build step: the files under
//! `assets/` are served exactly as they are in the repository. `kiln-store`
//! mounts [`asset`] at `/`; everything the UI shows comes from the store's
//! `/api/v1/` JSON API.

/// One embedded file, ready to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// The file's bytes, exactly as in `store/ui/assets/`.
    pub bytes: &'static [u8],
    /// The `Content-Type` header value.
    pub content_type: &'static str,
    /// The `Cache-Control` header value. Asset names carry no content hash,
    /// so browsers must revalidate to pick up a new release.
    pub cache_control: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";
const NO_CACHE: &str = "no-cache";

/// Every asset, by its path below `/` (no leading slash).
const ASSETS: &[(&str, &[u8], &str)] = &[
    ("index.html", include_bytes!("../assets/index.html"), HTML),
    ("style.css", include_bytes!("../assets/style.css"), CSS),
    ("favicon.svg", include_bytes!("../assets/favicon.svg"), SVG),
    ("js/app.js", include_bytes!("../assets/js/app.js"), JS),
    ("js/api.js", include_bytes!("../assets/js/api.js"), JS),
    (
        "js/query_state.js",
        include_bytes!("../assets/js/query_state.js"),
        JS,
    ),
    ("js/format.js", include_bytes!("../assets/js/format.js"), JS),
    (
        "js/sandwich.js",
        include_bytes!("../assets/js/sandwich.js"),
        JS,
    ),
    (
        "js/svg_export.js",
        include_bytes!("../assets/js/svg_export.js"),
        JS,
    ),
    (
        "js/flamegraph.js",
        include_bytes!("../assets/js/flamegraph.js"),
        JS,
    ),
    (
        "js/flame_layout.js",
        include_bytes!("../assets/js/flame_layout.js"),
        JS,
    ),
    (
        "js/timeline.js",
        include_bytes!("../assets/js/timeline.js"),
        JS,
    ),
    (
        "js/top_table.js",
        include_bytes!("../assets/js/top_table.js"),
        JS,
    ),
    (
        "js/matcher_input.js",
        include_bytes!("../assets/js/matcher_input.js"),
        JS,
    ),
    (
        "js/selection_panel.js",
        include_bytes!("../assets/js/selection_panel.js"),
        JS,
    ),
];

/// The asset served for a request path such as `/`, `/index.html` or
/// `/js/app.js`; `None` for anything else (the caller answers 404).
///
/// The query string, if the caller passes one, is ignored.
pub fn asset(request_path: &str) -> Option<Asset> {
    let path = request_path.split(['?', '#']).next().unwrap_or_default();
    let path = path.trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    ASSETS
        .iter()
        .find(|(name, _, _)| *name == path)
        .map(|&(_, bytes, content_type)| Asset {
            bytes,
            content_type,
            cache_control: NO_CACHE,
        })
}

/// Paths of every embedded asset (no leading slash), for tests and listings.
pub fn asset_paths() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(name, _, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_index_serve_the_same_html() {
        let root = asset("/").expect("root is served");
        let index = asset("/index.html").expect("index is served");
        assert_eq!(root, index);
        assert_eq!(root.content_type, HTML);
    }

    #[test]
    fn query_strings_do_not_change_the_asset() {
        assert_eq!(asset("/?query=x&from=now-1h"), asset("/"));
        assert_eq!(asset("/js/app.js?v=2"), asset("/js/app.js"));
    }

    #[test]
    fn unknown_and_traversal_paths_are_not_served() {
        assert_eq!(asset("/nope.js"), None);
        assert_eq!(asset("/../Cargo.toml"), None);
        assert_eq!(asset("/js/../../src/lib.rs"), None);
        assert_eq!(asset("/api/v1/labels"), None);
    }

    #[test]
    fn javascript_is_served_as_javascript() {
        let app = asset("/js/app.js").expect("app.js is served");
        assert_eq!(app.content_type, JS);
        assert!(!app.bytes.is_empty());
    }
}
