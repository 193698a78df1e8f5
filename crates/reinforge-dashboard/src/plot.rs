//! `reinforge plot`: the page's curves as a static figure for reports — one panel per
//! metric, one line per run — in PNG or SVG, with plotters. Text is set in Ubuntu Light,
//! embedded (the `epaint_default_fonts` crate), so a machine without fonts draws the same.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use crate::rundir::Run;
use crate::DashboardError;

/// What the x-axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// The training step.
    Step,
    /// Minutes since the run's first row.
    Time,
}

/// How to draw.
#[derive(Debug, Clone)]
pub struct PlotOptions {
    /// The metrics, one panel each.
    pub metrics: Vec<String>,
    /// Step or time.
    pub x: XAxis,
    /// Exponential smoothing weight in [0, 1) (0: raw).
    pub smooth: f64,
    /// Size in pixels.
    pub width: u32,
    /// Height of one panel in pixels.
    pub panel_height: u32,
}

impl Default for PlotOptions {
    fn default() -> Self {
        Self { metrics: vec!["critic/score/mean".into()], x: XAxis::Step, smooth: 0.0, width: 900, panel_height: 300 }
    }
}

/// One curve: (x, y) points of a metric in a run.
type Curve = Vec<(f64, f64)>;

fn load(run: &Run, metric: &str, x: XAxis, smooth: f64) -> Curve {
    let text = std::fs::read_to_string(run.dir.join("metrics.jsonl")).unwrap_or_default();
    let rows: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let t0 = rows.iter().find_map(|r| r["timestamp"].as_f64()).unwrap_or(0.0);
    let mut last: Option<f64> = None;
    rows.iter()
        .filter_map(|r| {
            let y = r[metric].as_f64()?;
            let xv = match x {
                XAxis::Step => r["step"].as_f64()?,
                XAxis::Time => (r["timestamp"].as_f64()? - t0) / 60.0,
            };
            let y = match last {
                Some(l) if smooth > 0.0 => smooth * l + (1.0 - smooth) * y,
                _ => y,
            };
            last = Some(y);
            Some((xv, y))
        })
        .collect()
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x2b, 0x6c, 0xb0),
    RGBColor(0xc0, 0x56, 0x21),
    RGBColor(0x2f, 0x85, 0x5a),
    RGBColor(0xb8, 0x32, 0x80),
    RGBColor(0x6b, 0x46, 0xc1),
    RGBColor(0x97, 0x5a, 0x16),
    RGBColor(0x2c, 0x7a, 0x7b),
    RGBColor(0xc5, 0x30, 0x30),
];

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font under plotters' generic family name; it cannot fail for bytes
        // that parse, and these are a fixed, valid TrueType file.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT);
    });
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, runs: &[Run], opts: &PlotOptions) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((opts.metrics.len().max(1), 1));
    for (metric, panel) in opts.metrics.iter().zip(panels) {
        let curves: Vec<(String, Curve)> = runs.iter().map(|r| (r.name.clone(), load(r, metric, opts.x, opts.smooth))).collect();
        let pts = || curves.iter().flat_map(|(_, c)| c.iter());
        let (mut x0, mut x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (mut y0, mut y1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if (x1 - x0).abs() < 1e-12 {
            x1 = x0 + 1.0;
        }
        let pad = ((y1 - y0).abs() * 0.05).max(1e-9);
        let mut chart = ChartBuilder::on(&panel)
            .caption(metric, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(match opts.x {
                XAxis::Step => "step",
                XAxis::Time => "minutes",
            })
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, curve)) in curves.iter().enumerate().filter(|(_, (_, c))| !c.is_empty()) {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(curve.iter().copied(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xcc, 0xcc, 0xcc))
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Draws `opts.metrics` of `runs` into `out` (`.png` or `.svg`), written to a temporary file
/// beside it and renamed into place, so a failed plot leaves no half-written figure.
pub fn plot(runs: &[Run], opts: &PlotOptions, out: &Path) -> Result<(), DashboardError> {
    let missing: Vec<&String> = opts.metrics.iter().filter(|m| runs.iter().all(|r| load(r, m, XAxis::Step, 0.0).is_empty())).collect();
    if !missing.is_empty() {
        let names: Vec<String> = runs.iter().map(|r| r.dir.join("metrics.jsonl").display().to_string()).collect();
        return Err(DashboardError::Plot(format!(
            "no values of {} in {}: name metrics the runs logged (e.g. critic/score/mean, actor/entropy)",
            missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
            names.join(", ")
        )));
    }
    fonts();
    let height = opts.panel_height * opts.metrics.len().max(1) as u32;
    let ext = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let tmp = out.with_file_name(format!(".{}.tmp-{}.{}", out.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(), std::process::id(), ext.as_deref().unwrap_or("x")));
    let drawn = match ext.as_deref() {
        Some("png") => draw(BitMapBackend::new(&tmp, (opts.width, height)).into_drawing_area(), runs, opts),
        Some("svg") => draw(SVGBackend::new(&tmp, (opts.width, height)).into_drawing_area(), runs, opts),
        _ => return Err(DashboardError::Plot(format!("{}: name a .png or .svg file", out.display()))),
    };
    let done = drawn.and_then(|_| std::fs::rename(&tmp, out).map_err(|e| e.to_string()));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(DashboardError::Plot(format!("drawing {}: {e}", out.display())));
    }
    Ok(())
}
