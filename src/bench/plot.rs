//! A line chart of benchmark results as a small hand-written SVG: tokens/s against
//! depth (when several depths were run), else against batch size (several -b/-ub), else
//! against test size; one line per model, backend and test kind. No plotting crate: the
//! chart is a few dozen elements, and the file opens in any browser.

use super::BenchRow;
use std::fmt::Write;

/// One line: its legend label and (x, y) points in x order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// Which setting the x axis shows.
#[derive(Clone, Copy, PartialEq)]
enum XAxis {
    Depth,
    Ubatch,
    Batch,
    Size,
}

fn distinct(rows: &[BenchRow], f: impl Fn(&BenchRow) -> u32) -> usize {
    let mut v: Vec<u32> = rows.iter().map(f).collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// The chart of a benchmark's rows (see the module note for the x axis).
pub fn bench_chart(rows: &[BenchRow]) -> Chart {
    let x = if distinct(rows, |r| r.n_depth) > 1 {
        XAxis::Depth
    } else if distinct(rows, |r| r.n_ubatch) > 1 {
        XAxis::Ubatch
    } else if distinct(rows, |r| r.n_batch) > 1 {
        XAxis::Batch
    } else {
        XAxis::Size
    };
    let batches = distinct(rows, |r| r.n_batch) > 1 || distinct(rows, |r| r.n_ubatch) > 1;
    // Cache types and flash attention (-ctk/-ctv/-fa lists) name the line where they vary.
    let cache_of =
        |r: &BenchRow| format!(" K {} V {} fa {}", r.type_k, r.type_v, r.flash_attn as u8);
    let caches = rows.iter().any(|r| cache_of(r) != cache_of(&rows[0]));
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let kind = match (r.n_prompt, r.n_gen) {
            (_, 0) => "pp",
            (0, _) => "tg",
            _ => "pg",
        };
        // What stays fixed along a line goes in its label.
        let test = match x {
            XAxis::Size => kind.to_string(),
            _ => super::report::test_name(r.n_prompt, r.n_gen, 0),
        };
        let batch = match x {
            XAxis::Depth if batches => format!(" b{}/ub{}", r.n_batch, r.n_ubatch),
            XAxis::Ubatch if distinct(rows, |r| r.n_batch) > 1 => format!(" b{}", r.n_batch),
            XAxis::Size if batches => format!(" b{}/ub{}", r.n_batch, r.n_ubatch),
            _ => String::new(),
        };
        let cache = if caches { cache_of(r) } else { String::new() };
        let label = format!("{} {} {test}{batch}{cache}", r.model_type, r.backend);
        let xv = match x {
            XAxis::Depth => r.n_depth,
            XAxis::Ubatch => r.n_ubatch,
            XAxis::Batch => r.n_batch,
            XAxis::Size => r.n_prompt + r.n_gen,
        } as f64;
        let y = r.ts_stats().0;
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((xv, y)),
            None => series.push(Series {
                label,
                points: vec![(xv, y)],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let x_label = match x {
        XAxis::Depth => "depth (tokens in the cache)",
        XAxis::Ubatch => "ubatch size (-ub)",
        XAxis::Batch => "batch size (-b)",
        XAxis::Size => "test size (prompt or generated tokens)",
    };
    Chart {
        title: "wgllm bench".into(),
        x_label: x_label.into(),
        y_label: "tokens/s".into(),
        series,
    }
}

/// [`bench_chart`] drawn with [`svg`].
pub fn bench_svg(rows: &[BenchRow]) -> String {
    svg(&bench_chart(rows))
}

/// Round tick positions covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
pub fn ticks(lo: f64, hi: f64, max_ticks: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / max_ticks.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut v = Vec::new();
    let mut t = (lo / step).ceil() * step;
    while t <= hi + step * 1e-9 {
        v.push(t);
        t += step;
    }
    v
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// The chart as an SVG document: axes with ticks and labels, a polyline and point
/// markers per series, and a legend on the right.
pub fn svg(c: &Chart) -> String {
    let (w, h) = (900.0, 500.0);
    let (left, right, top, bottom) = (80.0, 330.0, 50.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let pts = c.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut y1: f64 = 0.0;
    for &(x, y) in pts {
        (x0, x1, y1) = (x0.min(x), x1.max(x), y1.max(y));
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let y_ticks = ticks(0.0, if y1 > 0.0 { y1 * 1.1 } else { 1.0 }, 6);
    let y_top = y_ticks.last().copied().unwrap_or(1.0).max(y1).max(1e-9);
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| top + ph - y / y_top * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="25" text-anchor="middle" font-size="16">{}</text>"#,
        left + pw / 2.0,
        esc(&c.title)
    );
    // Grid, ticks and tick labels.
    for t in &y_ticks {
        let y = sy(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            num(*t)
        );
    }
    for t in ticks(x0, x1, 8) {
        let x = sx(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 5.0,
            top + ph + 18.0,
            num(t)
        );
    }
    // Axes and their labels.
    let _ = writeln!(
        s,
        r##"<path d="M{left} {top} V{:.1} H{:.1}" fill="none" stroke="#000"/>"##,
        top + ph,
        left + pw
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 15.0,
        esc(&c.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">{}</text>"#,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(&c.y_label)
    );
    // One polyline and its markers per series; the legend entry beside the plot.
    for (i, ser) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let p: Vec<String> = (ser.points.iter())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"><title>{}</title></polyline>"#,
            p.join(" "),
            esc(&ser.label)
        );
        for &(x, y) in &ser.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {} t/s</title></circle>"#,
                sx(x),
                sy(y),
                num(x),
                num(y)
            );
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let lx = left + pw + 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            ticks(16.0, 32.0, 8),
            [16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0, 32.0]
        );
        assert_eq!(ticks(0.0, 4096.0, 4), [0.0, 2000.0, 4000.0]);
    }

    /// `-fa 0,1` over two depths: a line per test and flash setting, named by it.
    #[test]
    fn flash_settings_get_their_own_lines() {
        let mut rows = Vec::new();
        for flash_attn in [false, true] {
            for n_depth in [0, 4096] {
                let mut r = BenchRow::empty();
                (r.type_k, r.type_v, r.flash_attn) = ("f16".into(), "f16".into(), flash_attn);
                (r.n_prompt, r.n_depth, r.samples_ns) = (512, n_depth, vec![1_000_000_000]);
                rows.push(r);
            }
        }
        let c = bench_chart(&rows);
        let labels: Vec<&str> = c.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(labels[0].ends_with("K f16 V f16 fa 0") && labels[1].ends_with("fa 1"));
        assert!(c.series.iter().all(|s| s.points.len() == 2));
        // One setting only: the label stays short.
        let one = bench_chart(&rows[..2]);
        assert!(
            !one.series[0].label.contains("fa"),
            "{}",
            one.series[0].label
        );
    }

    #[test]
    fn a_polyline_per_series() {
        let c = Chart {
            title: "t <&>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![
                Series {
                    label: "a".into(),
                    points: vec![(0.0, 1.0), (256.0, 0.5)],
                },
                Series {
                    label: "b".into(),
                    points: vec![(0.0, 2.0)],
                },
            ],
        };
        let s = svg(&c);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 3);
        assert!(s.contains("t &lt;&amp;&gt;"));
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
    }
}
