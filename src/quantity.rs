//! resource.Quantity as upstream reads, adds, compares and prints it, with
//! exact integer arithmetic: a value is a whole number of nano-units
//! (upstream rounds anything finer up to 1n) and remembers the format its
//! text was written in (`1Gi` binary, `1G` decimal, `1e9` exponent), so a
//! sum prints as upstream's `Quantity.String()` would (`500m`, `3`, `1536Mi`).
//!
//! One parser serves the API server (validation, admission), the
//! controllers, the scheduler and the agent; nothing else reads quantities.
//!
//! Values beyond ±(2^63−1) units are capped there (upstream caps binary
//! ones and keeps arbitrary precision for decimal ones; no resource comes
//! close).

use std::cmp::Ordering;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const NANO: i128 = 1_000_000_000;
/// The largest magnitude kept, in nano-units: (2^63 − 1) units.
const MAX_NANOS: i128 = i64::MAX as i128 * NANO;

/// Why a string is not a quantity; the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    FormatWrong,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// How a quantity prints: upstream's `resource.Format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// `1k`, `500m`, `2G`.
    #[default]
    DecimalSI,
    /// `1Ki`, `128Mi`.
    BinarySI,
    /// `1e3`, `5e-3`.
    DecimalExponent,
}

/// A parsed quantity: an exact number of nano-units and its format.
/// Equality and order are by value only (`1Gi == 1073741824`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Amount {
    nanos: i128,
    format: Format,
}

impl PartialEq for Amount {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Amount {}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Amount {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// The pieces of a quantity's text, as upstream's `parseQuantityString` splits it.
struct Pieces<'a> {
    negative: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn split(s: &str) -> Result<Pieces<'_>, QuantityError> {
    let b = s.as_bytes();
    let mut pos = 0;
    let negative = b.first() == Some(&b'-');
    if matches!(b.first(), Some(b'-') | Some(b'+')) {
        pos = 1;
    }
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let num_end = digits(pos);
    let num = &s[pos..num_end];
    pos = num_end;
    let mut denom = "";
    if pos < b.len() && b[pos] == b'.' {
        let end = digits(pos + 1);
        denom = &s[pos + 1..end];
        pos = end;
    }
    let suffix_start = pos;
    while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < b.len() && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    if digits(pos) != b.len() {
        return Err(QuantityError::FormatWrong);
    }
    Ok(Pieces { negative, num, denom, suffix: &s[suffix_start..] })
}

/// The suffix as (power of ten, power of two, format).
fn interpret(suffix: &str) -> Result<(i64, u32, Format), QuantityError> {
    let decimal = |e| Ok((e, 0, Format::DecimalSI));
    let binary = |p| Ok((0, p, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        e if e.len() > 1 && e.starts_with(['e', 'E']) => {
            let exp: i64 = e[1..].parse().map_err(|_| QuantityError::Suffix)?;
            Ok((exp, 0, Format::DecimalExponent))
        }
        _ => Err(QuantityError::Suffix),
    }
}

/// `ceil(0.F × k)` for the decimal fraction digits `F`, exactly, however
/// many digits there are.
fn fraction_times(fraction: &[u8], k: i128) -> i128 {
    fraction.iter().rev().fold(0i128, |acc, d| {
        let n = i128::from(d - b'0') * k + acc;
        (n + 9) / 10
    })
}

impl Amount {
    /// Reads `s` as upstream's `ParseQuantity` does (after the surrounding
    /// blanks JSON decoding trims): exact, rounded up (away from zero) to
    /// whole nano-units.
    pub fn parse(s: &str) -> Result<Amount, QuantityError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(QuantityError::FormatWrong);
        }
        let p = split(s)?;
        let (exp10, exp2, mut format) = interpret(p.suffix)?;
        let digits: Vec<u8> = p.num.bytes().chain(p.denom.bytes()).collect();
        let nonzero = digits.iter().any(|d| *d != b'0');
        // Place the decimal point for nano-units.
        let point = p.num.len() as i64 + exp10.saturating_add(9);
        let multiplier = 1i128 << exp2;
        let nanos = if !nonzero {
            0
        } else if point < -60 {
            1
        } else if point > 40 {
            MAX_NANOS
        } else {
            let point = point.max(0) as usize;
            let (int_digits, frac_digits): (Vec<u8>, Vec<u8>) = if point >= digits.len() {
                let mut i = digits.clone();
                i.resize(point, b'0');
                (i, Vec::new())
            } else {
                let lead = (p.num.len() as i64 + exp10 + 9).min(0).unsigned_abs() as usize;
                let mut f = vec![b'0'; lead];
                f.extend_from_slice(&digits[point..]);
                (digits[..point].to_vec(), f)
            };
            let int: i128 = int_digits
                .iter()
                .try_fold(0i128, |acc, d| acc.checked_mul(10)?.checked_add(i128::from(d - b'0')))
                .unwrap_or(MAX_NANOS);
            int.checked_mul(multiplier)
                .and_then(|i| i.checked_add(fraction_times(&frac_digits, multiplier)))
                .unwrap_or(MAX_NANOS)
                .min(MAX_NANOS)
        };
        if format == Format::BinarySI && nanos > 0 && nanos < NANO {
            format = Format::DecimalSI;
        }
        Ok(Amount { nanos: if p.negative { -nanos } else { nanos }, format })
    }

    /// The API type's quantity.
    pub fn of(q: &Quantity) -> Result<Amount, QuantityError> {
        Amount::parse(&q.0)
    }

    /// A count of objects (`pods: 3`).
    pub fn count(n: usize) -> Amount {
        Amount::from_units(n as i64, Format::DecimalSI)
    }

    pub fn from_units(units: i64, format: Format) -> Amount {
        Amount { nanos: i128::from(units) * NANO, format }
    }

    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// The sum; a zero takes the other's format, as upstream's `Add`.
    pub fn plus(self, other: Amount) -> Amount {
        let format = if self.nanos == 0 { other.format } else { self.format };
        Amount { nanos: (self.nanos + other.nanos).clamp(-MAX_NANOS, MAX_NANOS), format }
    }

    /// The difference; a zero takes the other's format, as upstream's `Sub`.
    pub fn minus(self, other: Amount) -> Amount {
        let format = if self.nanos == 0 { other.format } else { self.format };
        Amount { nanos: (self.nanos - other.nanos).clamp(-MAX_NANOS, MAX_NANOS), format }
    }

    /// The larger, with its own format (upstream's quota `Max`).
    pub fn max(self, other: Amount) -> Amount {
        if other.nanos > self.nanos {
            other
        } else {
            self
        }
    }

    /// `ceil(value × 10^scale)` away from zero, as upstream's `ScaledValue`.
    fn scaled(self, per_unit: i128) -> i64 {
        let div = NANO / per_unit;
        let q = self.nanos / div;
        let q = if self.nanos % div == 0 { q } else { q + self.nanos.signum() };
        q.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// Upstream's `Value()`: whole units, rounded up away from zero.
    pub fn value(self) -> i64 {
        self.scaled(1)
    }

    /// Upstream's `MilliValue()`: thousandths, rounded up away from zero.
    pub fn milli_value(self) -> i64 {
        self.scaled(1000)
    }

    /// The API type, in canonical form.
    pub fn to_quantity(self) -> Quantity {
        Quantity(self.to_string())
    }
}

/// Upstream's `CanonicalizeBytes`: the shortest exact form in the
/// quantity's format, with an exponent that is a multiple of three.
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySI && (self.nanos.abs() < 1024 * NANO || self.nanos % NANO != 0) {
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut units = self.nanos / NANO;
            let mut exp = 0;
            while exp < 6 && units % 1024 == 0 {
                units /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return write!(f, "{units}{suffix}");
        }
        let mut mantissa = self.nanos;
        let mut exp: i32 = -9;
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp += 1;
        }
        match exp % 3 {
            1 | -2 => {
                mantissa *= 10;
                exp -= 1;
            }
            2 | -1 => {
                mantissa *= 100;
                exp -= 2;
            }
            _ => {}
        }
        if format == Format::DecimalExponent {
            return if exp == 0 { write!(f, "{mantissa}") } else { write!(f, "{mantissa}e{exp}") };
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        write!(f, "{mantissa}{suffix}")
    }
}

/// The quantity in thousandths of its unit (millicores for CPU), rounded
/// up; `None` when it does not parse.
pub fn milli_value(q: &Quantity) -> Option<i64> {
    Amount::of(q).ok().map(Amount::milli_value)
}

/// The quantity in its unit (bytes for memory), rounded up; `None` when it
/// does not parse.
pub fn value(q: &Quantity) -> Option<i64> {
    Amount::of(q).ok().map(Amount::value)
}

/// Whether upstream's ParseQuantity reads `s`.
pub fn is_valid(s: &str) -> bool {
    Amount::parse(s).is_ok()
}

/// `s` in canonical form (`0.5` → `500m`, `1024Mi` → `1Gi`), or `None`.
pub fn canonical(s: &str) -> Option<String> {
    Amount::parse(s).ok().map(|a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    fn canon(s: &str) -> String {
        canonical(s).unwrap_or_else(|| format!("<invalid {s}>"))
    }

    #[test]
    fn reads_values_as_upstream() {
        assert_eq!(milli_value(&q("500m")), Some(500));
        assert_eq!(milli_value(&q("1.5")), Some(1500));
        assert_eq!(milli_value(&q("2")), Some(2000));
        assert_eq!(milli_value(&q("0.0001")), Some(1)); // rounded up
        assert_eq!(milli_value(&q("-0.0001")), Some(-1)); // away from zero
        assert_eq!(value(&q("128Mi")), Some(128 * 1024 * 1024));
        assert_eq!(value(&q("1G")), Some(1_000_000_000));
        assert_eq!(value(&q("1e3")), Some(1000));
        assert_eq!(value(&q("100m")), Some(1));
        assert_eq!(value(&q("1.5Gi")), Some(1536 * 1024 * 1024));
        assert_eq!(value(&q("abc")), None);
        assert_eq!(value(&q("1Qi")), None);
    }

    #[test]
    fn prints_canonical_forms() {
        for (input, out) in [
            ("0", "0"),
            ("0.0", "0"),
            ("1", "1"),
            ("0.5", "500m"),
            ("1000m", "1"),
            ("1500m", "1500m"),
            ("1500", "1500"),
            ("1000", "1k"),
            ("1.5k", "1500"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Ki", "512"),
            ("1Ki", "1Ki"),
            ("1000Ki", "1000Ki"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1500e0", "1500"),
            ("12e2", "1200"),
            ("5e-3", "5e-3"),
            ("1n", "1n"),
            ("0.1n", "1n"),
            ("10u", "10u"),
            ("+2", "2"),
            ("-1k", "-1k"),
            (".5", "500m"),
            ("5.", "5"),
            ("1E", "1E"),
            ("100M", "100M"),
            ("0.000000000000000000000000000000000000000000000000000000000000000001", "1n"),
        ] {
            assert_eq!(canon(input), out, "{input}");
            // Canonical forms are fixed points.
            assert_eq!(canon(out), out, "{out}");
        }
    }

    #[test]
    fn adds_keep_the_first_format() {
        let a = |s: &str| Amount::parse(s).unwrap_or_default();
        assert_eq!(a("500m").plus(a("500m")).to_string(), "1");
        assert_eq!(a("64Mi").plus(a("64Mi")).to_string(), "128Mi");
        assert_eq!(a("1Gi").plus(a("512Mi")).to_string(), "1536Mi");
        assert_eq!(Amount::default().plus(a("1Gi")).to_string(), "1Gi");
        assert_eq!(a("1G").plus(a("1Gi")).to_string(), "2073741824");
        assert_eq!(a("3").minus(a("1")).to_string(), "2");
        assert_eq!(Amount::count(3).to_string(), "3");
        assert_eq!(Amount::count(1000).to_string(), "1k");
        assert!(a("1Gi") > a("1G"));
        assert_eq!(a("1Gi"), a("1073741824"));
        assert!(a("100m") < a("0.1001"));
    }

    #[test]
    fn big_values_stay_exact_and_cap() {
        let a = |s: &str| Amount::parse(s).unwrap_or_default();
        assert_eq!(a("8Ei").value(), i64::MAX);
        assert_eq!(a("1e30").value(), i64::MAX);
        assert_eq!(a("9223372036854775807").to_string(), "9223372036854775807");
        assert_eq!(a("7Ei").to_string(), "7Ei");
        assert_eq!(a("123456789012345678").value(), 123_456_789_012_345_678);
        assert_eq!(a("1e-100").to_string(), "1e-9");
        assert_eq!(a("0.0000000000001m").to_string(), "1n");
        assert_eq!(a("0e100").to_string(), "0");
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        for bad in [
            "", "abc", "1..2", "1x", "1e", "1 Gi", "1Gib", "1.1.M", "1+1.0M", "0.1mi", "0.1am", ".5i", "1i", "-3.01e-",
            "1K",
        ] {
            assert!(!is_valid(bad), "{bad}");
        }
        for ok in ["1", "500m", "1.5Gi", "+2", "-1k", "1e3", "2E-2", ".5", "5.", " 1 "] {
            assert!(is_valid(ok), "{ok}");
        }
        assert_eq!(Amount::parse("1x"), Err(QuantityError::FormatWrong));
        assert_eq!(Amount::parse("1Qi"), Err(QuantityError::FormatWrong));
        assert_eq!(Amount::parse("1Ki2"), Err(QuantityError::Suffix));
    }
}
