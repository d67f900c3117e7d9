//! Reading what the status listener answers: php-fpm's text page (`/status?full`) into one
//! [`PoolView`] per pool, and the request-time histogram out of `/metrics`. Lenient: a line or
//! field that does not parse is skipped, never trusted for an index.

/// One pool as the text page and the metrics describe it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolView {
    /// The pool block's fields, label and value, in page order.
    pub fields: Vec<(String, String)>,
    /// One entry per worker (or server) block.
    pub rows: Vec<Vec<(String, String)>>,
    /// The request-time histogram: finite upper bounds and cumulative counts (then `+Inf`).
    pub latency: Option<(Vec<f64>, Vec<u64>)>,
}

impl PoolView {
    pub(super) fn get(&self, label: &str) -> Option<&str> {
        field(&self.fields, label)
    }

    pub(super) fn name(&self) -> &str {
        self.get("pool").unwrap_or("?")
    }

    pub(super) fn int(&self, label: &str) -> Option<u64> {
        self.get(label).and_then(|v| v.parse().ok())
    }
}

pub(super) fn field<'a>(fields: &'a [(String, String)], label: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == label)
        .map(|(_, v)| v.as_str())
}

/// Reads the text page (`/status?full`): a `pool:` line opens a pool block, a line of `*`
/// opens a worker block of the current pool, other lines are `label: value`; the front
/// listeners' blocks (`listener:`) come after every pool and are not read.
pub fn parse_text(page: &str) -> Vec<PoolView> {
    let mut pools: Vec<PoolView> = Vec::new();
    let mut in_row = false;
    for line in page.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.chars().all(|c| c == '*') {
            if let Some(p) = pools.last_mut() {
                p.rows.push(Vec::new());
                in_row = true;
            }
            continue;
        }
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let (label, value) = (label.trim().to_owned(), value.trim().to_owned());
        if label == "listener" {
            break;
        }
        if label == "pool" {
            pools.push(PoolView::default());
            in_row = false;
        }
        let Some(p) = pools.last_mut() else {
            continue;
        };
        match (in_row, p.rows.last_mut()) {
            (true, Some(row)) => row.push((label, value)),
            _ => p.fields.push((label, value)),
        }
    }
    pools
}

/// One sample of an OpenMetrics exposition: name, labels, value.
type MetricSample<'a> = (&'a str, Vec<(&'a str, String)>, f64);

/// One sample line of an OpenMetrics exposition.
fn parse_sample(line: &str) -> Option<MetricSample<'_>> {
    let line = line.trim();
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line.get(..name_end)?;
    let mut rest = line.get(name_end..)?;
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key_start = 0;
        loop {
            // key="value"
            let (eq, _) = chars.by_ref().find(|&(_, c)| c == '=')?;
            let key = inner.get(key_start..eq)?.trim_start_matches(',').trim();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
            labels.push((key, value));
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    rest = inner.get(i + 1..)?;
                    break;
                }
                ',' => key_start = i + 1,
                _ => return None,
            }
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// The request-time histograms in `/metrics`, by pool: finite bounds and cumulative counts,
/// in the order the exposition lists them (ascending `le`, then `+Inf`).
pub fn parse_latency(metrics: &str) -> Vec<(String, Vec<f64>, Vec<u64>)> {
    let mut out: Vec<(String, Vec<f64>, Vec<u64>)> = Vec::new();
    for line in metrics.lines() {
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        if name != "corral_request_seconds_bucket" || !(0.0..=1e18).contains(&value) {
            continue;
        }
        let label = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        let (Some(pool), Some(le)) = (label("pool"), label("le")) else {
            continue;
        };
        let i = match out.iter().position(|(p, ..)| *p == pool) {
            Some(i) => i,
            None => {
                out.push((pool, Vec::new(), Vec::new()));
                out.len() - 1
            }
        };
        let Some((_, bounds, counts)) = out.get_mut(i) else {
            continue;
        };
        if le != "+Inf" {
            match le.parse::<f64>() {
                Ok(b) if b.is_finite() => bounds.push(b),
                _ => continue,
            }
        }
        counts.push(value as u64);
    }
    // Usable only when every finite bucket has its bound, and +Inf is last.
    out.retain(|(_, b, c)| c.len() == b.len() + 1);
    out
}
