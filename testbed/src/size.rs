//! Human byte sizes on the command line: `16MiB`, `1GiB`, `500kB`, `4096`.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A byte count parsed from `<number>[unit]`; units KiB/MiB/GiB (powers of 1024), kB/MB/GB
/// (powers of 1000), K/M/G (treated as binary), B. Case-insensitive; fractions allowed (`1.5MiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidArgument { field: "size", reason: format!("{s:?} (examples: 4096, 64KiB, 16MiB, 1GB)") };
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            _ => return Err(bad()),
        };
        let v = n * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 / 2.0 {
            return Err(bad());
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        for (unit, m) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if v >= m && v.is_multiple_of(m) {
                return write!(f, "{}{unit}", v / m);
            }
        }
        write!(f, "{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!("16MiB".parse::<ByteSize>().unwrap().0, 16 << 20);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().0, 1536);
        assert_eq!("2MB".parse::<ByteSize>().unwrap().0, 2_000_000);
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(16 << 20).to_string(), "16MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }
}
