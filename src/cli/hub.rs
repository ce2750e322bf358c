//! `-hf` / `-hff` / `--hf-token` / `--offline` on every model command: a model from the
//! Hugging Face Hub, downloaded into the cache llama.cpp shares (wgllm::hub), with a
//! progress bar.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone, Debug, Default)]
pub struct HubArgs {
    /// A model from the Hugging Face Hub, ORG/NAME[:QUANT] (no quant: Q4_K_M, else Q8_0,
    /// else the first GGUF), downloaded once into the Hugging Face cache (HF_HOME,
    /// HF_HUB_CACHE or LLAMA_CACHE; the Hub at MODEL_ENDPOINT or HF_ENDPOINT).
    #[arg(
        long = "hf-repo",
        visible_alias = "hf",
        alias = "hfr",
        value_name = "ORG/NAME[:QUANT]"
    )]
    pub hf_repo: Option<String>,
    /// The repository's file to use, by its path (instead of a quant).
    #[arg(
        long = "hf-file",
        alias = "hff",
        requires = "hf_repo",
        value_name = "FILE"
    )]
    pub hf_file: Option<String>,
    /// Hugging Face token for gated or private repositories (default: HF_TOKEN).
    #[arg(long = "hf-token", alias = "hft", value_name = "TOKEN")]
    pub hf_token: Option<String>,
    /// Use models already in the cache; never ask the Hub.
    #[arg(long)]
    pub offline: bool,
}

impl HubArgs {
    /// The local path of the -hf model, downloading it if needed (None without -hf).
    #[cfg(not(feature = "hub"))]
    pub fn resolve(&self) -> Result<Option<PathBuf>> {
        match &self.hf_repo {
            None => Ok(None),
            Some(_) => anyhow::bail!(
                "-hf needs the `hub` cargo feature, which this build left out; download the file and pass it with -m"
            ),
        }
    }

    /// The local path of the -hf model, downloading it if needed (None without -hf).
    #[cfg(feature = "hub")]
    pub fn resolve(&self) -> Result<Option<PathBuf>> {
        Ok(self.resolve_with_mmproj(false)?.map(|r| r.0))
    }

    /// [`Self::resolve`], with `mmproj` the repository's vision encoder for the model
    /// too, where it has one (llama.cpp's choice of file).
    #[cfg(not(feature = "hub"))]
    pub fn resolve_with_mmproj(&self, _: bool) -> Result<Option<(PathBuf, Option<PathBuf>)>> {
        Ok(self.resolve()?.map(|p| (p, None)))
    }

    /// [`Self::resolve`], with `mmproj` the repository's vision encoder for the model
    /// too, where it has one (llama.cpp's choice of file).
    #[cfg(feature = "hub")]
    pub fn resolve_with_mmproj(&self, mmproj: bool) -> Result<Option<(PathBuf, Option<PathBuf>)>> {
        let Some(repo) = &self.hf_repo else {
            return Ok(None);
        };
        let mut opts = wgllm::hub::HubOptions::from_env()?;
        opts.offline = self.offline;
        if let Some(t) = &self.hf_token {
            opts.token = Some(t.clone());
        }
        let mut bar = Bar(None);
        let file = self.hf_file.as_deref();
        let got = wgllm::hub::fetch_with_mmproj(repo, file, &opts, mmproj, &mut bar);
        if let Some(b) = bar.0 {
            b.finish_and_clear();
        }
        let got = got?;
        if let Some(m) = &got.1 {
            log::info!(
                "{repo}: vision encoder {} (--no-mmproj to leave it out)",
                m.display()
            );
        }
        Ok(Some(got))
    }
}

/// The download's progress bar (made at the first bytes).
#[cfg(feature = "hub")]
struct Bar(Option<indicatif::ProgressBar>);

#[cfg(feature = "hub")]
impl wgllm::hub::Progress for Bar {
    fn download(&mut self, file: &str, done: u64, total: u64) {
        let bar = self.0.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "downloading {msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            b.set_message(file.rsplit('/').next().unwrap_or(file).to_string());
            b
        });
        bar.set_length(total.max(done));
        bar.set_position(done);
    }
    fn note(&mut self, line: &str) {
        log::info!("{line}");
    }
}
