//! resource.Quantity arithmetic as controllers and the scheduler need it:
//! `500m`, `1.5`, `128Mi`, `1e3`, `2Gi` read as exact integers of milli-units
//! or units, rounded up as upstream's `MilliValue()` and `Value()` do.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The quantity in thousandths of its unit (millicores for CPU), rounded up;
/// `None` when it cannot be read.
pub fn milli_value(q: &Quantity) -> Option<i64> {
    scaled(&q.0, 1000)
}

/// Whether upstream's ParseQuantity reads `s`: a signed decimal number
/// and an SI, binary or exponent suffix (`500m`, `1.5Gi`, `1e3`).
pub fn is_valid(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return false;
    }
    match suffix {
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        e => e
            .strip_prefix(['e', 'E'])
            .map(|x| x.strip_prefix(['+', '-']).unwrap_or(x))
            .is_some_and(|d| !d.is_empty() && d.len() <= 10 && d.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// The quantity in its unit (bytes for memory), rounded up.
pub fn value(q: &Quantity) -> Option<i64> {
    scaled(&q.0, 1)
}

/// `s` times `factor`, rounded up to an integer.
fn scaled(s: &str, factor: i128) -> Option<i64> {
    let s = s.trim();
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() {
        return None;
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.contains('.') || frac.len() > 18 || whole.len() > 20 {
        return None;
    }
    let digits: i128 = format!("{whole}{frac}").parse().ok()?;
    // value = digits × num / den
    let mut num: i128 = factor;
    let mut den: i128 = 10i128.pow(frac.len() as u32);
    let pow10 = |e: i32, num: &mut i128, den: &mut i128| {
        if e >= 0 {
            *num = num.saturating_mul(10i128.pow(e as u32));
        } else {
            *den = den.saturating_mul(10i128.pow((-e) as u32));
        }
    };
    match suffix {
        "" => {}
        "n" => pow10(-9, &mut num, &mut den),
        "u" => pow10(-6, &mut num, &mut den),
        "m" => pow10(-3, &mut num, &mut den),
        "k" => pow10(3, &mut num, &mut den),
        "M" => pow10(6, &mut num, &mut den),
        "G" => pow10(9, &mut num, &mut den),
        "T" => pow10(12, &mut num, &mut den),
        "P" => pow10(15, &mut num, &mut den),
        "E" => pow10(18, &mut num, &mut den),
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let k = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].iter().position(|x| *x == suffix)? as u32 + 1;
            num = num.saturating_mul(1024i128.pow(k));
        }
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok().filter(|x: &i32| x.abs() <= 18)?;
            pow10(exp, &mut num, &mut den);
        }
        _ => return None,
    }
    let product = digits.checked_mul(num)?;
    let v = if negative { -(product / den) } else { (product + den - 1) / den };
    i64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn reads_quantities_as_upstream() {
        assert_eq!(milli_value(&q("500m")), Some(500));
        assert_eq!(milli_value(&q("1.5")), Some(1500));
        assert_eq!(milli_value(&q("2")), Some(2000));
        assert_eq!(milli_value(&q("0.0001")), Some(1)); // rounded up
        assert_eq!(value(&q("128Mi")), Some(128 * 1024 * 1024));
        assert_eq!(value(&q("1G")), Some(1_000_000_000));
        assert_eq!(value(&q("1e3")), Some(1000));
        assert_eq!(value(&q("100m")), Some(1));
        assert_eq!(value(&q("1.5Gi")), Some(1536 * 1024 * 1024));
        assert_eq!(value(&q("abc")), None);
        assert_eq!(value(&q("1Qi")), None);
    }

    #[test]
    fn quantity_syntax() {
        for ok in ["1", "500m", "1.5Gi", "+2", "-1k", "1e3", "2E-2", ".5", "5."] {
            assert!(is_valid(ok), "{ok}");
        }
        for bad in ["", "abc", "1..2", "1x", "Gi", "1e", "1 Gi", "1Gib", "."] {
            assert!(!is_valid(bad), "{bad}");
        }
    }
}
