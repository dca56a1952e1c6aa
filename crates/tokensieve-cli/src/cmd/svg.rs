//! `explain --svg`: the step as a funnel. One band per stage (`<g class="band">`), its width
//! proportional to the log of the candidates the stage kept (`ln(1 + kept) / ln(1 + V)` of the
//! full width, the input row on top at full width), coloured by the probability mass kept
//! (blue: all of it, red: little), labelled with the candidate counts, the mass kept, the
//! entropy and the most likely tokens with their probability before -> after.

use super::explain::{fmt_p, Report, TokenRow};
use std::fmt::Write as _;

const MIN_WIDTH: f64 = 900.0;
/// Rough advance of one character at the label sizes (13 px sans, 12 px monospace).
const CHAR_WIDTH: f64 = 7.4;
const MARGIN: f64 = 20.0;
const FUNNEL: f64 = 380.0;
const BAND: f64 = 54.0;
const GAP: f64 = 8.0;
const TOP: f64 = 78.0;
const TEXT_X: f64 = MARGIN + FUNNEL + 24.0;

/// The funnel picture of `report`, as a standalone SVG document.
pub fn funnel(r: &Report) -> String {
    let n = r.stages.len();
    let selected = r.stages.last().and_then(|s| s.selected.as_ref());
    let height = TOP + (n as f64 + 1.0) * (BAND + GAP) + if selected.is_some() { 44.0 } else { 16.0 };
    let scale = |kept: usize| -> f64 {
        let full = (1.0 + r.vocab as f64).ln();
        (FUNNEL * (1.0 + kept as f64).ln() / full).clamp(2.0, FUNNEL)
    };
    let cx = MARGIN + FUNNEL / 2.0;
    let longest = r
        .stages
        .iter()
        .map(|st| (st.label.chars().count() + 80).max(tokens_text(&st.top, true).chars().count()))
        .chain([(r.chain.chars().count() + 7).saturating_sub((TEXT_X / CHAR_WIDTH) as usize)])
        .chain([tokens_text(&r.input_top, false).chars().count()])
        .max()
        .unwrap_or(0);
    let width = (TEXT_X + longest as f64 * CHAR_WIDTH + MARGIN).max(MIN_WIDTH).ceil();
    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<title>tokensieve explain: {}</title>"#, xml(&r.source));
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="{MARGIN}" y="28" font-size="17" font-weight="bold" fill="#222">{}</text>"##,
        xml(&r.source)
    );
    if !r.chain.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{MARGIN}" y="50" font-family="DejaVu Sans Mono, monospace" font-size="12" fill="#555">chain: {}</text>"##,
            xml(&r.chain)
        );
    }

    // The input row: full width.
    let y = TOP;
    let _ = writeln!(s, r#"<g class="input">"#);
    rect(&mut s, cx, y, scale(r.input_candidates), "#6b7280", 1.0);
    count_label(&mut s, cx, y, r.input_candidates);
    let _ = writeln!(
        s,
        r##"<text x="{TEXT_X}" y="{:.1}" font-weight="bold" fill="#222">input: {} candidates, entropy {:.2} bits</text>"##,
        y + 20.0,
        r.input_candidates,
        r.input_entropy
    );
    tokens_line(&mut s, y + 40.0, &r.input_top, false);
    let _ = writeln!(s, "</g>");

    for (i, st) in r.stages.iter().enumerate() {
        let y = TOP + (i as f64 + 1.0) * (BAND + GAP);
        // Blue when the stage kept all the mass, through green to red at half of it or less.
        let hue = 210.0 * ((st.mass_kept - 0.5) / 0.5).clamp(0.0, 1.0);
        let colour = format!("hsl({hue:.0}, 65%, 45%)");
        let _ = writeln!(
            s,
            r#"<g class="band" data-stage="{}" data-before="{}" data-after="{}" data-mass-kept="{:.6}">"#,
            i + 1,
            st.before,
            st.after,
            st.mass_kept
        );
        let _ = writeln!(
            s,
            "<title>{}: {} → {} candidates, {:.2}% of the mass kept</title>",
            xml(&st.label),
            st.before,
            st.after,
            st.mass_kept * 100.0
        );
        // A trapezoid from the previous width to this one shows the cut.
        let (w0, w1) = (scale(st.before), scale(st.after));
        let _ = writeln!(
            s,
            r#"<path d="M {:.1} {:.1} L {:.1} {:.1} L {:.1} {:.1} L {:.1} {:.1} Z" fill="{colour}" fill-opacity="0.25"/>"#,
            cx - w0 / 2.0,
            y - GAP,
            cx + w0 / 2.0,
            y - GAP,
            cx + w1 / 2.0,
            y,
            cx - w1 / 2.0,
            y
        );
        rect(&mut s, cx, y, w1, &colour, if st.inert { 0.45 } else { 1.0 });
        count_label(&mut s, cx, y, st.after);
        let inert = if st.inert { " (no-op)" } else { "" };
        let _ = writeln!(
            s,
            r##"<text x="{TEXT_X}" y="{:.1}" fill="#222"><tspan font-weight="bold">{}. {}{inert}</tspan>  {} → {} candidates, kept {:.2}% of the mass, entropy {:.2} bits</text>"##,
            y + 20.0,
            i + 1,
            xml(&st.label),
            st.before,
            st.after,
            st.mass_kept * 100.0,
            st.entropy
        );
        tokens_line(&mut s, y + 40.0, &st.top, true);
        let _ = writeln!(s, "</g>");
    }
    if let Some(sel) = selected {
        let y = TOP + (n as f64 + 1.0) * (BAND + GAP) + 16.0;
        let _ = writeln!(
            s,
            r##"<text class="selected" x="{MARGIN}" y="{y:.1}" font-size="15" font-weight="bold" fill="#166534">selected: {} (id {}), p = {} after the chain</text>"##,
            xml(&sel.text),
            sel.id,
            fmt_p(sel.after)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn rect(s: &mut String, cx: f64, y: f64, w: f64, fill: &str, opacity: f64) {
    let _ = writeln!(
        s,
        r#"<rect x="{:.1}" y="{y:.1}" width="{w:.1}" height="{BAND:.1}" rx="3" fill="{fill}" fill-opacity="{opacity}"/>"#,
        cx - w / 2.0
    );
}

fn count_label(s: &mut String, cx: f64, y: f64, count: usize) {
    let _ = writeln!(
        s,
        r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-weight="bold" fill="#ffffff" stroke="#00000055" stroke-width="0.6">{count}</text>"##,
        y + BAND / 2.0 + 5.0
    );
}

fn tokens_line(s: &mut String, y: f64, top: &[TokenRow], arrows: bool) {
    let text = tokens_text(top, arrows);
    let _ = writeln!(
        s,
        r##"<text x="{TEXT_X}" y="{y:.1}" font-family="DejaVu Sans Mono, monospace" font-size="12" fill="#333" xml:space="preserve">{}</text>"##,
        xml(&text)
    );
}

fn tokens_text(top: &[TokenRow], arrows: bool) -> String {
    super::explain::tokens_text(top, arrows, "   ")
}

/// Text as XML character data: markup characters escaped, characters XML 1.0 does not allow
/// written as `\u{…}`.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || matches!(c as u32, 0xFFFE | 0xFFFF) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_forbidden_characters() {
        assert_eq!(xml("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
        assert_eq!(xml("\u{1}x\u{FFFF}"), "\\u{1}x\\u{ffff}");
    }
}
