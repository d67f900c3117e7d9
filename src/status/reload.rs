//! The latest reload's outcome on `/status` (text and JSON, not the single-pool shape that
//! php-fpm tools read): whether it applied, and when it was refused, which pool refused
//! and why (`src/deploy/mod.rs`).

use std::time::UNIX_EPOCH;

use super::render::{http_log_time, json_string};
use crate::deploy::{Outcome, Record};

/// The text page's closing block about the latest reload.
pub fn text(record: &Record) -> String {
    let at = http_log_time(secs(record));
    match &record.outcome {
        Outcome::Applied { generation } => {
            format!("\nlast reload:          applied (generation {generation}) at {at}\n")
        }
        Outcome::Failed { reason, pool } => format!(
            "\nlast reload:          refused at {at}; the running configuration keeps serving\n\
             reload refused by:    {}\nreload refused why:   {reason}\n",
            pool.as_deref().unwrap_or("-")
        ),
    }
}

/// The JSON page's `"last_reload"` member, to go after its `"pools"` array: `,"last_reload":{...}`.
pub fn json_member(record: &Record) -> String {
    let mut out = String::from(",\"last_reload\":{");
    out.push_str(&format!(
        "\"number\":{},\"at\":{}",
        record.number,
        secs(record)
    ));
    match &record.outcome {
        Outcome::Applied { generation } => {
            out.push_str(&format!(",\"applied\":true,\"generation\":{generation}"));
        }
        Outcome::Failed { reason, pool } => {
            out.push_str(",\"applied\":false,\"pool\":");
            match pool {
                Some(p) => json_string(&mut out, p),
                None => out.push_str("null"),
            }
            out.push_str(",\"reason\":");
            json_string(&mut out, reason);
        }
    }
    out.push('}');
    out
}

/// Adds the member to a `{"pools":[...]}` page.
pub fn with_json_member(mut page: String, record: &Record) -> String {
    let trimmed = page.trim_end().len();
    if page[..trimmed].ends_with("]}") {
        page.truncate(trimmed - 1);
        page.push_str(&json_member(record));
        page.push_str("}\n");
    }
    page
}

fn secs(record: &Record) -> u64 {
    record
        .at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_reload_is_a_member_of_the_pools_page() {
        let record = Record {
            number: 2,
            at: UNIX_EPOCH + std::time::Duration::from_secs(7),
            outcome: Outcome::Failed {
                reason: "pool app: \"x\" exited".to_owned(),
                pool: Some("app".to_owned()),
            },
        };
        let page = with_json_member("{\"pools\":[{\"pool\":\"a\"}]}\n".to_owned(), &record);
        assert_eq!(
            page,
            "{\"pools\":[{\"pool\":\"a\"}],\"last_reload\":{\"number\":2,\"at\":7,\"applied\":false,\"pool\":\"app\",\"reason\":\"pool app: \\\"x\\\" exited\"}}\n"
        );
        assert!(text(&record).contains("reload refused by:    app\n"));
    }
}
