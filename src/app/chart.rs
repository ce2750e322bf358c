//! Prompt and generation speed over time: each decode step is a point (tokens / step
//! time), prompt steps and generation steps on two lines, the last minute shown.

use egui::{Color32, Pos2, Rect, Sense, Stroke, Vec2};

/// One decode step.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the app started.
    pub at: f64,
    pub tps: f64,
    pub prompt: bool,
}

pub const PROMPT: Color32 = Color32::from_rgb(245, 130, 48);
pub const EVAL: Color32 = Color32::from_rgb(60, 180, 75);

/// Seconds of history the chart shows.
const SPAN: f64 = 60.0;

pub fn show(ui: &mut egui::Ui, samples: &[Sample]) {
    let last = |prompt: bool| {
        samples
            .iter()
            .rev()
            .find(|s| s.prompt == prompt)
            .map_or("-".to_string(), |s| format!("{:.1}", s.tps))
    };
    ui.horizontal(|ui| {
        ui.colored_label(PROMPT, format!("prompt {} t/s", last(true)));
        ui.colored_label(EVAL, format!("eval {} t/s", last(false)));
    });
    let size = Vec2::new(ui.available_width().max(100.0), 110.0);
    let (resp, painter) = ui.allocate_painter(size, Sense::hover());
    let r = resp.rect;
    painter.rect_filled(r, 2.0, Color32::from_gray(24));
    let Some(end) = samples.last().map(|s| s.at) else {
        painter.text(
            r.center(),
            egui::Align2::CENTER_CENTER,
            "no decode yet",
            egui::FontId::proportional(12.0),
            Color32::GRAY,
        );
        return;
    };
    let start = end - SPAN;
    let shown: Vec<&Sample> = samples.iter().filter(|s| s.at >= start).collect();
    let top = shown.iter().map(|s| s.tps).fold(1.0, f64::max) * 1.1;
    let plot = Rect::from_min_max(r.min + Vec2::new(34.0, 6.0), r.max - Vec2::new(6.0, 16.0));
    let to_screen = |s: &Sample| {
        Pos2::new(
            plot.left() + ((s.at - start) / SPAN) as f32 * plot.width(),
            plot.bottom() - (s.tps / top) as f32 * plot.height(),
        )
    };
    let axis = Color32::from_gray(90);
    painter.line_segment(
        [plot.left_bottom(), plot.right_bottom()],
        Stroke::new(1.0, axis),
    );
    painter.line_segment(
        [plot.left_bottom(), plot.left_top()],
        Stroke::new(1.0, axis),
    );
    let font = egui::FontId::proportional(10.0);
    painter.text(
        plot.left_top() - Vec2::new(4.0, 0.0),
        egui::Align2::RIGHT_TOP,
        format!("{top:.0}"),
        font.clone(),
        Color32::GRAY,
    );
    painter.text(
        plot.left_bottom() - Vec2::new(4.0, 0.0),
        egui::Align2::RIGHT_BOTTOM,
        "0",
        font.clone(),
        Color32::GRAY,
    );
    painter.text(
        plot.right_bottom() + Vec2::new(0.0, 2.0),
        egui::Align2::RIGHT_TOP,
        "last 60 s",
        font,
        Color32::GRAY,
    );
    for (prompt, color) in [(true, PROMPT), (false, EVAL)] {
        let pts: Vec<Pos2> = shown
            .iter()
            .filter(|s| s.prompt == prompt)
            .map(|s| to_screen(s))
            .collect();
        for p in &pts {
            painter.circle_filled(*p, 2.0, color);
        }
        if pts.len() > 1 {
            painter.add(egui::Shape::line(pts, Stroke::new(1.5, color)));
        }
    }
}
