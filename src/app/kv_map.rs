//! The KV cache as a map: one square per cell, coloured by the sequence it belongs to
//! (white where several share it), dark when empty; a ring marks cells a context shift or
//! Self-Extend moved; cells past the `n_kv` bound (what attention reads) are dimmed
//! behind a red line. Hovering a cell shows its position and sequences. Recurrent states
//! (Mamba, a hybrid's convolution layers: one cell per sequence state) draw beside the
//! K/V map with a line from each state to the one it was copied from (`src`), and hovering
//! says which sequences' latest state (`tail`) a cell holds.
//!
//! A model split over several devices (`--device A,B`) first gets a strip of its layers,
//! one square per layer in its device's colour, and each device's part of every store:
//! the host keeps one set of cells, so one map serves all devices, and each device holds
//! the K/V (or state) rows of its own layers.

use crate::engine::{CacheMap, DevicePart, StoreMap};
use egui::{Color32, Rect, Sense, Stroke, StrokeKind, Vec2};

/// Colour of sequence `s` (the chat tab of the same number uses it too).
pub fn seq_color(s: u32) -> Color32 {
    const PALETTE: [Color32; 8] = [
        Color32::from_rgb(66, 135, 245),
        Color32::from_rgb(245, 130, 48),
        Color32::from_rgb(60, 180, 75),
        Color32::from_rgb(220, 60, 160),
        Color32::from_rgb(145, 30, 180),
        Color32::from_rgb(70, 200, 200),
        Color32::from_rgb(210, 200, 40),
        Color32::from_rgb(170, 110, 40),
    ];
    PALETTE[s as usize % PALETTE.len()]
}

/// Colour of device `d` of a split (none of the sequences' colours).
pub fn device_color(d: usize) -> Color32 {
    const PALETTE: [Color32; 4] = [
        Color32::from_rgb(0, 150, 136),
        Color32::from_rgb(233, 30, 99),
        Color32::from_rgb(121, 85, 72),
        Color32::from_rgb(96, 125, 139),
    ];
    PALETTE[d % PALETTE.len()]
}

/// The colour of an empty cell.
pub const EMPTY: Color32 = Color32::from_gray(48);
/// The colour of a cell shared by several sequences.
pub const SHARED: Color32 = Color32::from_gray(235);
/// The ring of a moved cell.
pub const MOVED: Color32 = Color32::from_rgb(255, 230, 0);

fn cell_color(seq: u64) -> Color32 {
    match seq.count_ones() {
        0 => EMPTY,
        1 => seq_color(seq.trailing_zeros()),
        _ => SHARED,
    }
}

fn seqs(mask: u64) -> String {
    let ids: Vec<String> = (0..64)
        .filter(|s| mask & (1u64 << s) != 0)
        .map(|s| s.to_string())
        .collect();
    ids.join(", ")
}

/// Draws every store of the cache, each with its counts.
pub fn show(ui: &mut egui::Ui, map: &CacheMap) {
    let t = &map.types;
    let fa = if t.flash { ", flash attention" } else { "" };
    let types = format!("K {}, V {}{fa}", t.type_k, t.type_v);
    if map.devices.len() > 1 {
        devices_ui(ui, map);
        ui.add_space(6.0);
    }
    for store in &map.stores {
        let types = if store.is_recurrent() {
            "f32 states"
        } else {
            &types
        };
        store_ui(ui, store, types);
        ui.add_space(6.0);
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The split: each device's line (name, backend, main, layers, its cache and all it
/// holds), then the model's layers as squares in their device's colour.
fn devices_ui(ui: &mut egui::Ui, map: &CacheMap) {
    ui.label(format!(
        "layers split over {} devices; the host keeps one set of cells for all of them",
        map.devices.len()
    ));
    for (d, p) in map.devices.iter().enumerate() {
        let cache = map.device_cache_bytes(d);
        ui.colored_label(
            device_color(d),
            format!(
                "{} ({}){}: layers {}, {:.1} MiB of cache, {:.1} MiB in all",
                p.name,
                p.backend,
                if p.main {
                    ", main: embeddings, output head"
                } else {
                    ""
                },
                p.layers_text(),
                mib(cache),
                mib(p.allocated)
            ),
        );
    }
    let of_layer: Vec<usize> = {
        let n: usize = (map.devices.iter())
            .flat_map(|p| p.layers.iter().map(|&(a, n)| a + n))
            .max()
            .unwrap_or(0);
        let mut v = vec![0; n];
        for (d, p) in map.devices.iter().enumerate() {
            for &(a, k) in &p.layers {
                v[a..a + k].fill(d);
            }
        }
        v
    };
    if of_layer.is_empty() {
        return;
    }
    let width = ui.available_width().max(64.0);
    let side = (width / of_layer.len() as f32).clamp(8.0, 16.0).floor();
    let cols = ((width / side).floor() as usize).max(1);
    let rows = of_layer.len().div_ceil(cols);
    let (resp, painter) = ui.allocate_painter(
        Vec2::new(cols as f32 * side, rows as f32 * side),
        Sense::hover(),
    );
    let origin = resp.rect.min;
    for (il, &d) in of_layer.iter().enumerate() {
        let (r, c) = (il / cols, il % cols);
        let rect = Rect::from_min_size(
            origin + Vec2::new(c as f32 * side, r as f32 * side),
            Vec2::splat(side - 1.0),
        );
        painter.rect_filled(rect, 0.0, device_color(d));
    }
    if let Some(p) = resp.hover_pos() {
        let rel = p - origin;
        let (c, r) = ((rel.x / side) as usize, (rel.y / side) as usize);
        let il = r * cols + c;
        if let (true, Some(&d)) = (c < cols, of_layer.get(il)) {
            let dev: &DevicePart = &map.devices[d];
            resp.on_hover_text_at_pointer(format!("layer {il}: on {} ({})", dev.name, dev.backend));
        }
    }
}

fn store_ui(ui: &mut egui::Ui, st: &StoreMap, types: &str) {
    let n = st.cells.len();
    let by_device = if st.device_bytes.len() > 1 {
        let parts: Vec<String> = (st.device_bytes.iter())
            .map(|&b| format!("{:.1}", mib(b)))
            .collect();
        format!(" = {} by device", parts.join(" + "))
    } else {
        String::new()
    };
    ui.label(format!(
        "{}: {} / {} cells used, n_kv {}, {} moved, {:.1} MiB{by_device} ({types})",
        st.name,
        st.used,
        n,
        st.n_kv.min(n),
        st.moved(),
        mib(st.bytes)
    ));
    if n == 0 {
        return;
    }
    // Squares as large as fit the width, 3 to 12 pixels, with a one-pixel gap.
    let width = ui.available_width().max(64.0);
    let side = ((width * width / n as f32).sqrt()).clamp(3.0, 12.0).floor();
    let cols = ((width / side).floor() as usize).max(1);
    let rows = n.div_ceil(cols);
    let (resp, painter) = ui.allocate_painter(
        Vec2::new(cols as f32 * side, rows as f32 * side),
        Sense::hover(),
    );
    let origin = resp.rect.min;
    let rect_of = |i: usize| {
        let (r, c) = (i / cols, i % cols);
        Rect::from_min_size(
            origin + Vec2::new(c as f32 * side, r as f32 * side),
            Vec2::splat(side - 1.0),
        )
    };
    let n_kv = st.n_kv.min(n);
    for (i, c) in st.cells.iter().enumerate() {
        let mut color = cell_color(c.seq);
        if i >= n_kv {
            color = color.gamma_multiply(0.45);
        }
        let r = rect_of(i);
        painter.rect_filled(r, 0.0, color);
        if c.moved && !c.is_empty() && side >= 5.0 {
            painter.rect_stroke(r, 0.0, Stroke::new(1.0, MOVED), StrokeKind::Inside);
        } else if c.moved && !c.is_empty() {
            painter.rect_filled(r.shrink(side / 3.0), 0.0, MOVED);
        }
    }
    // A copied state: a line from the cell it was copied from.
    for (i, src) in st.sources.iter().enumerate() {
        if let Some(j) = src.filter(|&j| j != i && j < n) {
            let (a, b) = (rect_of(j).center(), rect_of(i).center());
            painter.line_segment([a, b], Stroke::new(1.5, SHARED));
        }
    }
    // The n_kv bound: a red bar before the first cell attention does not read.
    if n_kv < n {
        let r = rect_of(n_kv);
        painter.line_segment(
            [r.left_top(), r.left_bottom() + Vec2::new(0.0, 1.0)],
            Stroke::new(2.0, Color32::RED),
        );
    }
    if let Some(p) = resp.hover_pos() {
        let rel = p - origin;
        let (c, r) = ((rel.x / side) as usize, (rel.y / side) as usize);
        let i = r * cols + c;
        if c < cols && i < n {
            let cell = st.cells[i];
            let text = if cell.is_empty() {
                format!("cell {i}: empty")
            } else if st.is_recurrent() {
                let tails: Vec<String> = (st.tails.iter())
                    .filter(|t| t.1 == i)
                    .map(|t| t.0.to_string())
                    .collect();
                let from = match st.sources.get(i).copied().flatten() {
                    Some(j) if j != i => format!(", copied from cell {j}"),
                    Some(_) => String::new(),
                    None => ", started from zeros".into(),
                };
                format!(
                    "state {i}: last pos {}, sequences {{{}}}, latest state of {{{}}}{from}",
                    cell.pos,
                    seqs(cell.seq),
                    tails.join(", ")
                )
            } else {
                format!(
                    "cell {i}: pos {}, sequences {{{}}}{}{}",
                    cell.pos,
                    seqs(cell.seq),
                    if cell.moved { ", moved by a shift" } else { "" },
                    if i >= n_kv { ", beyond n_kv" } else { "" }
                )
            };
            resp.on_hover_text_at_pointer(text);
        }
    }
}
