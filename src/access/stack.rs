//! A worker's stacks in a slow-request log entry: asked for when the request passed
//! `slow_threshold` (`src/gateway/slow_stacks.rs`) and written with its line, in the slow log
//! only. Text: the entry's line, then one line per stack line, indented with `  | `; JSON: a
//! `stack` array of lines and `stack_complete`.

use super::AccessFormat;

/// What the worker wrote when asked, for the slow log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowStack {
    /// The worker asked.
    pub pid: u32,
    /// Its lines, escaped as corral logs them (no control bytes).
    pub lines: Vec<String>,
    /// Whether the dump ended before corral stopped waiting for it.
    pub complete: bool,
}

/// `line` (one entry, ending with a newline) with `stack` after it, in `format`.
pub fn append(mut line: String, format: AccessFormat, stack: &SlowStack) -> String {
    match format {
        AccessFormat::Text => {
            line.push_str("  | stacks of worker ");
            line.push_str(&stack.pid.to_string());
            line.push_str(if stack.complete {
                " at slow_threshold:\n"
            } else {
                " at slow_threshold (its dump did not end in time):\n"
            });
            for l in &stack.lines {
                line.push_str("  | ");
                line.push_str(l);
                line.push('\n');
            }
            line
        }
        AccessFormat::Json => {
            let end = line.trim_end().len().saturating_sub(1);
            if line.get(end..).is_some_and(|tail| tail.starts_with('}')) {
                line.truncate(end);
            } else {
                return line;
            }
            line.push_str(",\"stack\":[");
            for (i, l) in stack.lines.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                line.push('"');
                crate::logs::json_escape(&mut line, l.as_bytes());
                line.push('"');
            }
            line.push_str("],\"stack_complete\":");
            line.push_str(if stack.complete { "true" } else { "false" });
            line.push_str("}\n");
            line
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack() -> SlowStack {
        SlowStack {
            pid: 42,
            lines: vec![
                "Current thread 0x1 (most recent call first):".to_owned(),
                "  File \"/srv/app.py\", line 7 in app".to_owned(),
            ],
            complete: true,
        }
    }

    #[test]
    fn text_entries_get_indented_stack_lines() {
        let text = append("line\n".to_owned(), AccessFormat::Text, &stack());
        assert_eq!(
            text,
            "line\n  | stacks of worker 42 at slow_threshold:\n  | Current thread 0x1 (most recent call first):\n  |   File \"/srv/app.py\", line 7 in app\n"
        );
    }

    #[test]
    fn json_entries_get_a_stack_array() {
        let text = append("{\"a\":1}\n".to_owned(), AccessFormat::Json, &stack());
        assert_eq!(
            text,
            "{\"a\":1,\"stack\":[\"Current thread 0x1 (most recent call first):\",\"  File \\\"/srv/app.py\\\", line 7 in app\"],\"stack_complete\":true}\n"
        );
    }
}
