//! The desktop app, driven headless under Xvfb on lavapipe: it loads SmolLM2, sends
//! llama.cpp's smol-chat question through the chat template, waits for the reply
//! (through a context shift: -c 64), saves the window, and exits. The reply must start
//! with llama.cpp's reliable prefix; the PNG must show one square per used cell in the
//! first chat's colour, rings on the cells the shift moved, and the conversation's text.
#![cfg(feature = "app")]

mod common;

use std::collections::VecDeque;
use std::process::Command;

/// An RGBA image.
struct Image {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Image {
    fn load(path: &std::path::Path) -> Image {
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut r = dec.read_info().unwrap();
        let mut px = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut px).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgba, "RGBA screenshot");
        Image {
            w: info.width as usize,
            h: info.height as usize,
            px,
        }
    }

    fn rgb(&self, x: usize, y: usize) -> [u8; 3] {
        let i = 4 * (y * self.w + x);
        [self.px[i], self.px[i + 1], self.px[i + 2]]
    }

    /// Squares of `color` (within 2 per channel) in columns x0.., at least 7 pixels on
    /// a side: the map's cells, not glyphs of coloured text.
    fn squares(&self, x0: usize, color: [u8; 3]) -> usize {
        let near = |c: [u8; 3]| (0..3).all(|k| c[k].abs_diff(color[k]) <= 2);
        let mut seen = vec![false; self.w * self.h];
        let mut count = 0;
        for y in 0..self.h {
            for x in x0..self.w {
                if seen[y * self.w + x] || !near(self.rgb(x, y)) {
                    continue;
                }
                // Flood fill one component; keep its bounding box.
                let (mut lo, mut hi) = ((x, y), (x, y));
                let mut q = VecDeque::from([(x, y)]);
                seen[y * self.w + x] = true;
                while let Some((cx, cy)) = q.pop_front() {
                    lo = (lo.0.min(cx), lo.1.min(cy));
                    hi = (hi.0.max(cx), hi.1.max(cy));
                    let n = [
                        (cx.wrapping_sub(1), cy),
                        (cx + 1, cy),
                        (cx, cy.wrapping_sub(1)),
                        (cx, cy + 1),
                    ];
                    for (nx, ny) in n {
                        if nx >= x0 && nx < self.w && ny < self.h {
                            let i = ny * self.w + nx;
                            if !seen[i] && near(self.rgb(nx, ny)) {
                                seen[i] = true;
                                q.push_back((nx, ny));
                            }
                        }
                    }
                }
                let (bw, bh) = (hi.0 - lo.0 + 1, hi.1 - lo.1 + 1);
                if bw >= 7 && bh >= 7 && bw.abs_diff(bh) <= 1 {
                    count += 1;
                }
            }
        }
        count
    }
}

/// Runs `wgllm app ARGS` under Xvfb (a 1400x900 screen, the window 1280x800, the drive's
/// timeout 600 s, warnings logged) with `env` set; checks that it succeeded without a
/// panic and returns its stdout and stderr.
fn app_under_xvfb(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1400x900x24"])
        .arg(env!("CARGO_BIN_EXE_wgllm"))
        .arg("app")
        .args(args)
        .args(["--timeout", "600", "--size", "1280x800"])
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("xvfb-run (apt-get install xvfb xauth) runs the app under a virtual display");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "app failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

/// Drives the app headless under Xvfb on SmolLM2: the chat prompt, greedy, 40 tokens,
/// one chat of `n_ctx` cells, with `env` set; the window saved to `shot`. Checks that the
/// drive succeeded with llama.cpp's reply; returns the log (stderr).
fn drive(shot: &std::path::Path, n_ctx: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    let model = common::smollm2();
    let _ = std::fs::remove_file(shot);
    let prompt = "What is the boiling point of water at sea level?";
    let fixed = [
        "-m",
        &model,
        "--temp",
        "0",
        "-n",
        "40",
        "-c",
        n_ctx,
        "-np",
        "1",
        "-p",
        prompt,
        "--screenshot",
    ];
    let mut all: Vec<&std::ffi::OsStr> = fixed.iter().map(std::ffi::OsStr::new).collect();
    all.push(shot.as_os_str());
    all.extend(args.iter().map(std::ffi::OsStr::new));
    let (stdout, stderr) = app_under_xvfb(&all, env);
    let expected = common::reliable_prefix("smol-chat.cpu.json");
    assert!(
        stdout.starts_with(&expected),
        "reply {stdout:?} does not start with llama.cpp's {expected:?}"
    );
    stderr
}

#[test]
fn headless_chat_shows_reply_and_cache_map() {
    let dir = std::env::temp_dir().join(format!("wgllm-app-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("app.png");
    let stderr = drive(&shot, "64", &[], &[]);
    // "full cache: 50 of 64 cells used, 32 moved by a shift"
    let line = stderr
        .lines()
        .find(|l| l.starts_with("full cache: "))
        .unwrap_or_else(|| panic!("no cache line: {stderr}"));
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    let (used, cells, moved) = (nums[0], nums[1], nums[2]);
    assert_eq!(cells, 64);
    assert!(
        used > 40,
        "prompt (41 tokens) and reply in the cache: {line}"
    );
    assert!(moved > 0, "-c 64 with 41 + 40 tokens must shift: {line}");

    let img = Image::load(&shot);
    assert_eq!((img.w, img.h), (1280, 800), "window size");
    // The cache map is in the right panel; chat 1's colour is (66, 135, 245); moved
    // cells carry a (255, 230, 0) ring (and a smaller blue square inside it).
    let right = img.w * 2 / 3;
    assert_eq!(
        img.squares(right, [66, 135, 245]),
        used,
        "one square per used cell"
    );
    assert_eq!(
        img.squares(right, [255, 230, 0]),
        moved,
        "one ring per moved cell"
    );
    assert_eq!(
        img.squares(right, [48, 48, 48]),
        cells - used,
        "empty cells"
    );
    // The conversation: light text (egui draws it at ~140 grey) on the dark chat panel,
    // several lines of it.
    let text_rows = (60..img.h - 120)
        .filter(|&y| (img.w / 4..right).any(|x| img.rgb(x, y).iter().all(|&c| c > 110)))
        .count();
    assert!(text_rows > 30, "the chat shows text ({text_rows} rows)");
}

/// The GPU lost in the middle of the drive's reply (`WGLLM_FAULT=device-lost@12`): the
/// app says so and starts again on the same adapter with the model, the flags and the
/// chats; the new app (without the fault) answers the prompt as llama.cpp does, and the
/// drive's exit and output are the new app's.
#[test]
fn a_lost_gpu_starts_the_app_again_and_the_chat_goes_on() {
    let dir = std::env::temp_dir().join(format!("wgllm-app-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("app.png");
    let stderr = drive(&shot, "256", &[("WGLLM_FAULT", "device-lost@12")], &[]);
    assert!(
        stderr.contains("the GPU was lost (injected by WGLLM_FAULT)")
            && stderr.contains("starting the app again"),
        "{stderr}"
    );
    assert!(shot.exists(), "the new app saved the window");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The model split by layers over lavapipe (Vulkan, the window's device) and llvmpipe
/// (GL): the reply is llama.cpp's, each device's line names its layers and its part of
/// the cache, and the cache map draws one square per layer in its device's colour.
#[test]
fn headless_chat_on_a_split_model_shows_each_device_part() {
    let dir = std::env::temp_dir().join(format!("wgllm-app-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("app.png");
    let stderr = drive(&shot, "64", &[], &["--device", "vulkan0,gl0", "-ts", "2,1"]);
    // "device llvmpipe (...) (Vulkan), main: layers 0-19, 960 KiB of cache"
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("device "))
        .collect();
    assert_eq!(lines.len(), 2, "one line per device: {stderr}");
    assert!(
        lines[0].contains("(Vulkan), main: layers 0-"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("(Gl): layers "), "{}", lines[1]);
    let count = |l: &str| -> (usize, u64) {
        let runs = l
            .split("layers ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        let (a, b) = runs.split_once('-').unwrap();
        let n = b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1;
        let kib = l.rsplit(", ").next().unwrap().split(' ').next().unwrap();
        (n, kib.parse().unwrap())
    };
    let ((n0, c0), (n1, c1)) = (count(lines[0]), count(lines[1]));
    assert_eq!(n0 + n1, 30, "SmolLM2's 30 layers: {lines:?}");
    assert!(
        n0 > n1,
        "-ts 2,1 gives the first device more layers: {lines:?}"
    );
    // Each device holds its layers' K and V: the cache bytes go as the layer counts.
    assert!(c0 > 0 && c1 > 0, "{lines:?}");
    assert_eq!(
        c0 * n1 as u64,
        c1 * n0 as u64,
        "each layer's cache is the same size on either device: {lines:?}"
    );
    let img = Image::load(&shot);
    let right = img.w * 2 / 3;
    assert_eq!(img.squares(right, [0, 150, 136]), n0, "device 0's layers");
    assert_eq!(img.squares(right, [233, 30, 99]), n1, "device 1's layers");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An image in the app's chat (`--mmproj`, `--image` with the drive's message): Gemma-3-270M
/// with the synthetic mmproj llama.cpp's references used continues the message as
/// llama-mtmd-cli does (the same 16 greedy tokens as `wgllm run --image`,
/// tests/vision.rs), and the window shows the image in the conversation.
#[test]
fn headless_chat_with_an_image_shows_it_and_replies_as_llamacpp() {
    let dir = common::scratch_dir("app-image");
    let mm = common::mmproj_270m(&dir);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let want = common::square_image_reply();
    let lm = common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
    let shot = dir.join("app-image.png");
    let img = root.join("tests/data/vision/square-224.png");
    let os = std::ffi::OsStr::new;
    let args = [
        os("-m"),
        lm.as_os_str(),
        os("--mmproj"),
        mm.as_os_str(),
        os("--image"),
        img.as_os_str(),
        os("--temp"),
        os("0"),
        os("-n"),
        os("16"),
        os("-c"),
        os("256"),
        os("-np"),
        os("1"),
        os("-p"),
        os("Count from one to twenty, in words."),
        os("--screenshot"),
        shot.as_os_str(),
    ];
    let (stdout, stderr) = app_under_xvfb(&args, &[]);
    assert_eq!(
        stdout.trim_end_matches('\n'),
        want.trim_end_matches('\n'),
        "{stderr}"
    );
    // The image's bright green bands in the chat panel (nothing else there is that green).
    let img = Image::load(&shot);
    let green = (60..img.h - 120)
        .flat_map(|y| (img.w / 4..img.w * 2 / 3).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let [r, g, b] = img.rgb(x, y);
            g > 200 && r < 90 && b < 90
        })
        .count();
    assert!(
        green > 300,
        "the image is shown in the chat ({green} green pixels)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
