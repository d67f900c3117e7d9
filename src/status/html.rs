//! `/status?html`: a page for people, self-contained (inline CSS and JS, no external asset, a
//! Content-Security-Policy that forbids any), served as it is. Its script reads
//! `?json&full` every second (the table, the live req/s) and `?history` every two seconds
//! (the sparklines and recent notices), from the same path it was served on, so it works on
//! the status listener and on a FastCGI listener's `status_path` alike (keeping `?pool=`).

/// The page (`src/status/page.html`).
pub const PAGE: &str = include_str!("page.html");

/// Its content type.
pub const CONTENT_TYPE: &str = "text/html; charset=utf-8";

/// What the page may load: nothing but itself and the JSON beside it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The headers every status answer carries, on the status listener and on a FastCGI
/// listener's `status_path` alike (`server::reply` adds them, and `server::cgi_answer` passes
/// every header of that answer on): the page may load nothing from elsewhere and may not be
/// framed by another site (the CSP's `frame-ancestors`, and `X-Frame-Options` for browsers
/// that predate it), no answer is sniffed as another type, and no referrer leaves the page.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for needle in ["src=", "href=\"http", "@import", "url(", "//cdn", "<link"] {
            assert!(!PAGE.contains(needle), "the page has {needle:?}");
        }
        assert!(PAGE.contains("json&full") && PAGE.contains("\"history\""));
    }
}
