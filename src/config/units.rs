//! Parsers for the human-written values in the configuration: sizes ("256MiB"), durations
//! ("1h30m") and Unix permission modes ("0660"). Each returns a sentence on failure.

use std::time::Duration;

/// The longest duration accepted anywhere. Timers add durations to the clock; capping them
/// keeps that addition far from overflow, and no sane timeout is longer.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Parses a byte size: a whole number and an optional unit.
///
/// `B` (or none) = bytes; `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` = powers of 1024
/// (as nginx and PHP read `1G`); `KB`, `MB`, `GB`, `TB` = powers of 1000. Units are
/// case-insensitive, may follow a space, and `_` may group digits.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() {
        return Err(format!(
            "size \"{text}\" does not start with a number; write it like \"256MiB\""
        ));
    }
    let unit = unit.trim_start();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ if unit.starts_with('.') => {
            return Err(format!(
                "size \"{text}\" has a fraction; use a smaller unit, like \"1536MiB\""
            ))
        }
        _ => {
            return Err(format!(
                "size \"{text}\" has unknown unit \"{unit}\"; use B, KiB, MiB, GiB, TiB \
                 (K, M, G, T mean the same) or KB, MB, GB, TB for powers of 1000"
            ))
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("size \"{text}\" is too large"))
}

/// Parses a duration such as "30s", "1h30m", "1h 30m" or "250ms", at most a year (365 days).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("duration \"{text}\" is not valid: {e}"))?;
    if d > MAX_DURATION {
        return Err(format!("duration \"{text}\" is longer than a year"));
    }
    Ok(d)
}

/// Parses a Unix permission mode written in octal: "0660", "660" or "0o660", at most 0777.
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let valid = (3..=4).contains(&digits.len()) && digits.chars().all(|c| ('0'..='7').contains(&c));
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if valid && mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "mode \"{text}\" is not an octal permission like \"0660\" (at most 0777)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1kB"), Ok(1_000));
        assert_eq!(parse_size("1_000_000"), Ok(1_000_000));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_size("")
            .unwrap_err()
            .contains("does not start with a number"));
        assert!(parse_size("MiB")
            .unwrap_err()
            .contains("does not start with a number"));
        assert!(parse_size("-1M")
            .unwrap_err()
            .contains("does not start with a number"));
        assert!(parse_size("1.5G").unwrap_err().contains("fraction"));
        assert!(parse_size("12XB")
            .unwrap_err()
            .contains("unknown unit \"XB\""));
        assert!(parse_size("1 2M").unwrap_err().contains("unknown unit"));
        assert!(parse_size("16777216T").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("365days"), Ok(MAX_DURATION));
    }

    #[test]
    fn bad_durations_say_why() {
        assert!(parse_duration("5")
            .unwrap_err()
            .contains("time unit needed"));
        assert!(parse_duration("5 parsecs")
            .unwrap_err()
            .contains("unknown time unit"));
        assert!(parse_duration("").unwrap_err().contains("is not valid"));
        assert!(parse_duration("2years")
            .unwrap_err()
            .contains("longer than a year"));
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o600"), Ok(0o600));
        assert_eq!(parse_mode("0777"), Ok(0o777));
        for bad in ["", "66", "0668", "1777", "07777", "rw-rw----", "+660"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
