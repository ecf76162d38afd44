//! The sizes and durations flags and the config file are written in.

use std::time::Duration;

/// Plain bytes, or a number with `Ki`/`Mi`/`Gi` (Kubernetes quantities) or
/// `KiB`/`MiB`/`GiB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let amount: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 512Mi or 2Gi"))?;
    let shift = match unit.trim() {
        "" => 0,
        "Ki" | "KiB" => 10,
        "Mi" | "MiB" => 20,
        "Gi" | "GiB" => 30,
        other => return Err(format!("{text:?}: unit {other:?} is not one of Ki, Mi, Gi")),
    };
    amount
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A duration in Kiln's one grammar (`500ms`, `30s`, `1h30m`, `14d`, or
/// plain seconds; docs/durations.md), with its error as the message the config
/// errors carry.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    kiln_contract::duration::parse_duration(text).map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse_duration("5 s"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("1 fortnight").is_err());
    }
}
