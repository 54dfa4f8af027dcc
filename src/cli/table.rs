//! Aligned columns for the one-shot commands' listings, kubectl's style.

/// `header` and `rows` in columns three spaces apart.
pub fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let header = header.map(String::from);
    let all: Vec<&[String; N]> = std::iter::once(&header).chain(rows).collect();
    let widths: Vec<usize> = (0..N).map(|i| all.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    for r in all {
        let cells: Vec<String> = (0..N).map(|i| format!("{:w$}", r[i], w = widths[i])).collect();
        println!("{}", cells.join("   ").trim_end());
    }
}
