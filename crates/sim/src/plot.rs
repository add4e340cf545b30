//! Minimal, dependency-free SVG line plots for simulator outputs.
//!
//! Used for FCT slowdown by flow size, per-port queue length, PFC pause and
//! per-flow goodput time series. The output is a pure function of the input:
//! numbers are printed with fixed precision and there are no timestamps or
//! hash-ordered collections, so identical input gives byte-identical SVG.

use std::fmt::Write as _;

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 500.0;
/// Plot area in pixels; the legend sits to the right of `RIGHT`.
const LEFT: f64 = 70.0;
const RIGHT: f64 = 620.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 440.0;
/// Legend rows that fit beside the plot area; further series are summarised.
const LEGEND_ROWS: usize = 20;
/// Longest legend name (in chars) before it is truncated with an ellipsis.
const LEGEND_CHARS: usize = 20;
/// Series colours (Tableau 10), reused cyclically.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($($t:tt)*) => { let _ = writeln!($($t)*); };
}

/// One named line of `(x, y)` points, drawn in the order given.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Data points; non-finite ones (and non-positive ones on log axes) are skipped.
    pub points: Vec<(f64, f64)>,
}

/// Axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear axis with 1-2-5 tick steps.
    Linear,
    /// Base-10 logarithmic axis with ticks at decades.
    Log10,
}

impl Scale {
    /// Whether `v` can be placed on an axis of this scale.
    fn accepts(self, v: f64) -> bool {
        v.is_finite() && (self == Scale::Linear || v > 0.0)
    }
}

/// A line plot rendered to SVG by [`Plot::to_svg`].
pub struct Plot {
    /// Title drawn above the plot area.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// Scale of the x axis.
    pub x_scale: Scale,
    /// Scale of the y axis.
    pub y_scale: Scale,
    /// Series to draw, each in its own palette colour.
    pub series: Vec<Series>,
    /// Draw points as markers joined by lines (true) or as a step/line only (false).
    pub markers: bool,
}

impl Plot {
    /// An empty linear/linear plot without markers.
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Plot {
        Plot {
            title: title.to_string(),
            x_label: x_label.to_string(),
            y_label: y_label.to_string(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series: Vec::new(),
            markers: false,
        }
    }

    /// Use a log10 x axis.
    pub fn log_x(mut self) -> Self {
        self.x_scale = Scale::Log10;
        self
    }

    /// Use a log10 y axis.
    pub fn log_y(mut self) -> Self {
        self.y_scale = Scale::Log10;
        self
    }

    /// Draw a marker at every point.
    pub fn markers(mut self) -> Self {
        self.markers = true;
        self
    }

    /// Append a series.
    pub fn series(mut self, name: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series {
            name: name.to_string(),
            points,
        });
        self
    }

    /// The SVG document (800x500 px) with axes, ticks, grid, legend and title.
    pub fn to_svg(&self) -> String {
        let (xs, ys) = (self.x_scale, self.y_scale);
        let ok = |&(x, y): &(f64, f64)| xs.accepts(x) && ys.accepts(y);
        let pts: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| s.points.iter().copied().filter(ok).collect())
            .collect();
        let xa = Axis::new(xs, pts.iter().flatten().map(|p| p.0));
        let ya = Axis::new(ys, pts.iter().flatten().map(|p| p.1));
        let px = |x: f64| LEFT + xa.frac(x) * (RIGHT - LEFT);
        let py = |y: f64| BOTTOM - ya.frac(y) * (BOTTOM - TOP);
        let (cx, cy) = ((LEFT + RIGHT) / 2.0, (TOP + BOTTOM) / 2.0);

        let mut o = String::new();
        w!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        w!(
            o,
            r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let (pw, ph) = (RIGHT - LEFT, BOTTOM - TOP);
        let area = format!(r#"x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}""#);
        w!(
            o,
            r#"<defs><clipPath id="plot-area"><rect {area}/></clipPath></defs>"#
        );
        let title = r#" text-anchor="middle" font-size="16" font-weight="bold""#;
        text(&mut o, (cx, 24.0), title, &esc(&self.title));

        // Grid: minor lines (log axes' 2..9 × decade) under major lines at ticks.
        w!(o, r#"<g class="grid">"#);
        let (minor, major) = (r##" stroke="#f0f0f0""##, r##" stroke="#d8d8d8""##);
        for (vals, attr) in [(&xa.minor, minor), (&xa.ticks, major)] {
            for &x in vals {
                line(&mut o, (px(x), TOP), (px(x), BOTTOM), attr);
            }
        }
        for (vals, attr) in [(&ya.minor, minor), (&ya.ticks, major)] {
            for &y in vals {
                line(&mut o, (LEFT, py(y)), (RIGHT, py(y)), attr);
            }
        }
        w!(o, "</g>");

        // Frame, tick marks, tick labels and axis labels.
        w!(o, r##"<g class="axes" stroke="#333" fill="#333">"##);
        w!(o, r#"<rect {area} fill="none"/>"#);
        let mid = r#" text-anchor="middle" stroke="none""#;
        let end = r#" text-anchor="end" stroke="none""#;
        for &x in &xa.ticks {
            line(&mut o, (px(x), BOTTOM), (px(x), BOTTOM + 5.0), "");
            text(&mut o, (px(x), BOTTOM + 18.0), mid, &si(x));
        }
        for &y in &ya.ticks {
            line(&mut o, (LEFT - 5.0, py(y)), (LEFT, py(y)), "");
            text(&mut o, (LEFT - 8.0, py(y) + 4.0), end, &si(y));
        }
        text(&mut o, (cx, BOTTOM + 42.0), mid, &esc(&self.x_label));
        let rotated = format!(r#" transform="rotate(-90 18 {cy})"{mid}"#);
        text(&mut o, (18.0, cy), &rotated, &esc(&self.y_label));
        w!(o, "</g>");

        // Data, clipped to the plot area.
        w!(o, r#"<g class="series" clip-path="url(#plot-area)">"#);
        for (i, p) in pts.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            w!(o, r#"<g stroke="{c}" fill="{c}">"#);
            if p.len() >= 2 {
                let xy = |&(x, y): &(f64, f64)| format!("{:.1},{:.1}", px(x), py(y));
                let coords = p.iter().map(xy).collect::<Vec<_>>().join(" ");
                w!(
                    o,
                    r#"<polyline fill="none" stroke-width="1.5" points="{coords}"/>"#
                );
            }
            if self.markers || p.len() == 1 {
                for &(x, y) in p {
                    let (x, y) = (px(x), py(y));
                    w!(
                        o,
                        r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" stroke="none"/>"#
                    );
                }
            }
            w!(o, "</g>");
        }
        w!(o, "</g>");
        if pts.iter().all(Vec::is_empty) {
            let grey = r##" text-anchor="middle" font-size="16" fill="#888""##;
            text(&mut o, (cx, cy), grey, "no data");
        }

        // Legend beside the plot area.
        w!(o, r#"<g class="legend">"#);
        for (i, s) in self.series.iter().enumerate().take(LEGEND_ROWS) {
            let c = PALETTE[i % PALETTE.len()];
            let y = TOP + 10.0 + 18.0 * i as f64;
            let stroke = format!(r#" stroke="{c}" stroke-width="2""#);
            line(&mut o, (RIGHT + 15.0, y), (RIGHT + 35.0, y), &stroke);
            if self.markers {
                let x = RIGHT + 25.0;
                w!(o, r#"<circle cx="{x}" cy="{y}" r="3" fill="{c}"/>"#);
            }
            let name = esc(&truncate(&s.name));
            text(&mut o, (RIGHT + 42.0, y + 4.0), "", &name);
        }
        if self.series.len() > LEGEND_ROWS {
            let more = format!("+{} more", self.series.len() - LEGEND_ROWS);
            let y = TOP + 14.0 + 18.0 * LEGEND_ROWS as f64;
            text(&mut o, (RIGHT + 15.0, y), "", &more);
        }
        w!(o, "</g>");
        w!(o, "</svg>");
        o
    }
}

/// A resolved axis: data range, major tick values and (log only) minor grid values.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
}

impl Axis {
    /// Range and ticks covering `values` (already filtered by `scale.accepts`).
    fn new(scale: Scale, values: impl Iterator<Item = f64>) -> Axis {
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            min = min.min(v);
            max = max.max(v);
        }
        match scale {
            Scale::Linear => {
                // Keep the span finite; points beyond are drawn off-canvas and clipped.
                (min, max) = (min.clamp(-1e300, 1e300), max.clamp(-1e300, 1e300));
                if min > max {
                    (min, max) = (0.0, 1.0); // no data
                } else if min == max {
                    let d = if min == 0.0 { 1.0 } else { min.abs() * 0.5 };
                    (min, max) = (min - d, max + d);
                }
                let step = nice_step((max - min) / 8.0);
                let klo = (min / step + 1e-9).floor();
                let khi = (max / step - 1e-9).ceil().max(klo + 1.0);
                let ticks = (klo as i64..=khi as i64).map(|k| k as f64 * step).collect();
                Axis {
                    scale,
                    lo: klo * step,
                    hi: khi * step,
                    ticks,
                    minor: Vec::new(),
                }
            }
            Scale::Log10 => {
                let (mut elo, mut ehi) = if min > max {
                    (0, 1) // no data
                } else {
                    let e = |v: f64, eps: f64| v.log10() + eps;
                    (e(min, 1e-9).floor() as i32, e(max, -1e-9).ceil() as i32)
                };
                if elo >= ehi {
                    (elo, ehi) = (elo - 1, ehi + 1);
                }
                (elo, ehi) = (elo.max(-300), ehi.min(300));
                // At most ~10 labelled decades; the range ends on a labelled one.
                let every = ((ehi - elo) as usize).div_ceil(10).max(1);
                ehi = elo + (every * ((ehi - elo) as usize).div_ceil(every)) as i32;
                let ticks = (elo..=ehi).step_by(every).map(pow10).collect();
                let minor = if every == 1 && ehi - elo <= 8 {
                    (elo..ehi)
                        .flat_map(|e| (2..10).map(move |m| f64::from(m) * pow10(e)))
                        .collect()
                } else {
                    Vec::new()
                };
                Axis {
                    scale,
                    lo: pow10(elo),
                    hi: pow10(ehi),
                    ticks,
                    minor,
                }
            }
        }
    }

    /// Position of `v` along the axis: 0 at `lo`, 1 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log10 => (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10()),
        }
    }
}

/// The 1-2-5 × 10^k step nearest above `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let mag = pow10(raw.log10().floor() as i32);
    let n = raw / mag;
    let m = [1.0, 2.0, 5.0].into_iter().find(|&m| n <= m + 1e-9);
    m.unwrap_or(10.0) * mag
}

/// Short SI label: `1000` → `"1K"`, `1500000` → `"1.5M"`, `2.5e9` → `"2.5G"`;
/// below 1000 plain decimals (`0.001` → `"0.001"`), trailing zeros trimmed.
/// Non-zero magnitudes below 1e-6 or from 1e12 up use exponent form (`"1e-7"`, `"2.5e12"`).
pub fn si(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    // Pick the unit by the value as it will round (999999.9 is "1M", not "1000K").
    let a = v.abs() / (1.0 - 5e-7);
    if a != 0.0 && !(1e-6..1e12).contains(&a) {
        let s = format!("{v:.3e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        return format!("{}e{exp}", trim_zeros(mantissa));
    }
    let units = [(1e9, "G", 3), (1e6, "M", 3), (1e3, "K", 3), (1.0, "", 9)];
    let (div, suffix, decimals) = units.into_iter().find(|u| a >= u.0).unwrap_or(units[3]);
    match trim_zeros(&format!("{:.decimals$}", v / div)) {
        "-0" => "0".to_string(),
        s => format!("{s}{suffix}"),
    }
}

/// `"1.500"` → `"1.5"`, `"2.000"` → `"2"`; strings without a `.` are unchanged.
fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Exactly the `f64` nearest to 10^e (`powi` can be off by an ulp).
fn pow10(e: i32) -> f64 {
    format!("1e{e}").parse().unwrap_or(f64::NAN)
}

/// Append a `<line>` from `a` to `b`; `attrs` starts with a space (or is empty).
fn line(o: &mut String, a: (f64, f64), b: (f64, f64), attrs: &str) {
    let ((x1, y1), (x2, y2)) = (a, b);
    w!(
        o,
        r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"{attrs}/>"#
    );
}

/// Append a `<text>` at `p`; `attrs` starts with a space (or is empty), `body` is escaped.
fn text(o: &mut String, p: (f64, f64), attrs: &str, body: &str) {
    let (x, y) = p;
    w!(o, r#"<text x="{x:.1}" y="{y:.1}"{attrs}>{body}</text>"#);
}

/// Escape text for XML content and attribute values; control characters become spaces.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if c.is_control() => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Shorten a legend name to `LEGEND_CHARS` characters.
fn truncate(s: &str) -> String {
    if s.chars().count() <= LEGEND_CHARS {
        s.to_string()
    } else {
        s.chars().take(LEGEND_CHARS - 1).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tags nest properly and no non-finite number leaked: well-formed enough for our output.
    fn check(svg: &str) {
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
        let mut stack: Vec<&str> = Vec::new();
        for part in svg.split('<').skip(1) {
            let tag = &part[..part.find('>').expect("unterminated tag")];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                stack.push(tag.split(' ').next().unwrap());
            }
        }
        assert!(stack.is_empty(), "unclosed {stack:?}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    fn fct() -> Plot {
        let sizes = [1e3, 1e4, 1e5, 1e6, 1e7];
        Plot::new("FCT slowdown", "flow size (B)", "slowdown")
            .log_x()
            .log_y()
            .markers()
            .series("p50", sizes.iter().map(|&s| (s, 1.2)).collect())
            .series("p99", sizes.iter().map(|&s| (s, 3.0 + s.log10())).collect())
    }

    #[test]
    fn si_labels() {
        let cases = [
            (1000.0, "1K"),
            (1.5e6, "1.5M"),
            (2.5e9, "2.5G"),
            (0.001, "0.001"),
        ];
        let more = [(0.0, "0"), (-0.0, "0"), (999.0, "999"), (-1500.0, "-1.5K")];
        for (v, s) in cases.into_iter().chain(more).chain([
            (0.1 + 0.2, "0.3"),
            (1e-7, "1e-7"),
            (2.5e12, "2.5e12"),
            (999_999.9, "1M"),
            (999.9994, "999.9994"),
        ]) {
            assert_eq!(si(v), s, "si({v})");
        }
    }

    #[test]
    fn deterministic_and_well_formed() {
        let a = fct().to_svg();
        assert_eq!(a, fct().to_svg());
        check(&a);
        assert!(a.contains(">FCT slowdown</text>") && a.contains(">p99</text>"));
        assert!(!a.contains("no data"));
    }

    #[test]
    fn ticks() {
        let ax = Axis::new(Scale::Log10, [1e3, 5e6].into_iter());
        assert_eq!(ax.ticks, vec![1e3, 1e4, 1e5, 1e6, 1e7]);
        let svg = fct().to_svg();
        for l in ["1K", "10K", "100K", "1M", "10M"] {
            assert!(svg.contains(&format!(">{l}</text>")), "missing tick {l}");
        }
        let ax = Axis::new(Scale::Log10, [0.01, 100.0].into_iter());
        assert_eq!(
            ax.ticks.iter().map(|&t| si(t)).collect::<Vec<_>>(),
            ["0.01", "0.1", "1", "10", "100"]
        );
        let ax = Axis::new(Scale::Log10, [1000.0].into_iter());
        assert_eq!((ax.lo, ax.hi), (100.0, 10000.0));
        let ax = Axis::new(Scale::Linear, [0.0, 97.0].into_iter());
        assert_eq!((ax.lo, ax.hi, ax.ticks.len()), (0.0, 100.0, 6));
        assert_eq!(ax.ticks[1], 20.0);
        for v in [5.0, 0.0, -3.0] {
            let ax = Axis::new(Scale::Linear, [v, v].into_iter());
            assert!(ax.lo < v && v < ax.hi && ax.ticks.len() >= 2, "{v}");
        }
    }

    #[test]
    fn empty_plot_says_no_data() {
        let svg = Plot::new("q", "t (µs)", "KB").to_svg();
        check(&svg);
        assert!(svg.contains("no data"));
        let svg = Plot::new("q", "t", "KB")
            .log_x()
            .series("port0", vec![])
            .to_svg();
        check(&svg);
        assert!(svg.contains("no data") && svg.contains(">port0</text>"));
    }

    #[test]
    fn non_finite_and_non_positive_skipped() {
        let pts = vec![
            (0.0, 1.0),
            (f64::NAN, 2.0),
            (1.0, f64::INFINITY),
            (2.0, 3.0),
            (3.0, 4.0),
        ];
        let svg = Plot::new("t", "x", "y").series("s", pts.clone()).to_svg();
        check(&svg);
        assert_eq!(
            svg.matches(',').count(),
            3,
            "three finite points in the polyline"
        );
        let svg = Plot::new("t", "x", "y").log_x().series("s", pts).to_svg();
        check(&svg);
        assert_eq!(svg.matches(',').count(), 2, "x=0 dropped on log axis");
        let svg = Plot::new("t", "x", "y")
            .series("s", vec![(f64::NAN, 1.0)])
            .to_svg();
        check(&svg);
        assert!(svg.contains("no data"));
        let svg = Plot::new("t", "x", "y")
            .series("s", vec![(7.0, 7.0)])
            .to_svg();
        check(&svg);
        assert_eq!(
            svg.matches("<circle").count(),
            1,
            "a lone point is still drawn"
        );
    }

    #[test]
    fn text_is_escaped() {
        let svg = Plot::new("a<b & \"c\"", "x>y", "'y'")
            .series("s&t", vec![(1.0, 1.0)])
            .to_svg();
        check(&svg);
        assert!(svg.contains("a&lt;b &amp; &quot;c&quot;") && !svg.contains("a<b"));
        assert!(svg.contains("x&gt;y") && svg.contains("&apos;y&apos;") && svg.contains("s&amp;t"));
    }

    #[test]
    fn distinct_colours_and_legend_overflow() {
        let mut p = Plot::new("g", "t", "Gbps");
        for i in 0..25 {
            p = p.series(&format!("flow {i}"), vec![(0.0, i as f64), (1.0, i as f64)]);
        }
        let svg = p.to_svg();
        check(&svg);
        for c in &PALETTE[..8] {
            assert!(svg.contains(&format!("stroke=\"{c}\"")));
        }
        assert!(svg.contains("+5 more"));
    }
}
