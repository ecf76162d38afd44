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

/// `500ms`, `30s`, `5m`, `1h`, `14d`, `2w`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let amount: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s, 5m, 1h or 14d"))?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        other => {
            return Err(format!(
                "{text:?}: unit {other:?} is not one of ms, s, m, h, d, w"
            ));
        }
    };
    amount
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(14 * 86_400)));
        assert!(parse_duration("1y").is_err());
    }
}
