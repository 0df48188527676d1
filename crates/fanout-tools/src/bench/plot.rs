//! PNG plots shaped like the papers' figures: one or more panels side by side, a line per
//! series, a shared x axis.

use plotters::prelude::*;
use std::path::Path;

pub struct Panel<'a> {
    pub y_label: &'a str,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// A logarithmic y axis, for figures that span decades (latencies of ms beside s);
    /// points at or below zero are left out of it.
    pub log_y: bool,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

pub fn panels(path: &Path, title: &str, x_label: &str, log_x: bool, panels: &[Panel]) -> anyhow::Result<()> {
    // Up to three panels a row, so that five or six stay readable.
    let n = panels.len().max(1);
    let cols = n.min(3);
    let rows = n.div_ceil(cols);
    let root = BitMapBackend::new(path, (560 * cols as u32, 460 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let areas = root.split_evenly((rows, cols));
    for (area, p) in areas.iter().zip(panels) {
        let pts = p.series.iter().flat_map(|s| s.1.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, 0.0f64);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
            if y > 0.0 {
                y0 = y0.min(y);
            }
        }
        if x0 > x1 {
            (x0, x1) = (0.0, 1.0);
        }
        if x0 == x1 {
            x1 = x0 + 1.0;
        }
        let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
        let mut chart = ChartBuilder::on(area);
        chart.margin(12).x_label_area_size(40).y_label_area_size(60);
        match (log_x, p.log_y) {
            (false, false) => draw_lines(&mut chart.build_cartesian_2d(x0..x1, 0.0..y1)?, x_label, p)?,
            (true, false) => {
                draw_lines(&mut chart.build_cartesian_2d((x0.max(1e-9)..x1).log_scale(), 0.0..y1)?, x_label, p)?
            }
            (log_x, true) => {
                let y0 = if y0 > y1 { y1 / 10.0 } else { y0 / 1.5 };
                let y = (y0..y1 * 1.4).log_scale();
                if log_x {
                    draw_lines(&mut chart.build_cartesian_2d((x0.max(1e-9)..x1).log_scale(), y)?, x_label, p)?
                } else {
                    draw_lines(&mut chart.build_cartesian_2d(x0..x1, y)?, x_label, p)?
                }
            }
        }
    }
    root.present()?;
    Ok(())
}

fn draw_lines<'a, X, Y>(
    c: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    x_label: &str,
    p: &Panel,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    c.configure_mesh().x_desc(x_label).y_desc(p.y_label).draw()?;
    for (i, (name, s)) in p.series.iter().enumerate() {
        let col = COLORS[i % COLORS.len()];
        let s: Vec<(f64, f64)> = s.iter().copied().filter(|&(_, y)| !p.log_y || y > 0.0).collect();
        c.draw_series(LineSeries::new(s.iter().copied(), col.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
        c.draw_series(s.iter().map(|&pt| Circle::new(pt, 3, col.filled())))?;
    }
    c.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;
    Ok(())
}
