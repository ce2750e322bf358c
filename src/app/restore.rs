//! What an app that lost its GPU hands to the app it starts in its place: each chat's
//! conversation, in a JSON file (`[[{"role": ..., "content": ...}, ...], ...]`, one list
//! per chat) named by `--restore-chats`, and its own command line again.
//!
//! A window's device cannot be replaced once lost (egui draws on the device the model
//! runs on), so the app starts anew rather than reloading in place, as the server does.

use crate::tokenizer::ChatMessage;
use std::ffi::OsString;
use std::path::Path;

/// The flag that names the file.
pub const FLAG: &str = "--restore-chats";

/// Writes `chats` to `path`. Images do not go with them: their markers (this process's
/// own, [`crate::engine::private_marker`], which the next process would read as text)
/// are left out, so the text of a turn that had images comes back without them.
pub fn save(path: &Path, chats: &[Vec<ChatMessage>]) -> std::io::Result<()> {
    let marker = crate::engine::private_marker();
    let json: Vec<Vec<serde_json::Value>> = chats
        .iter()
        .map(|c| {
            c.iter()
                .map(|m| {
                    let content = m.content.replace(marker, "");
                    serde_json::json!({"role": m.role, "content": content})
                })
                .collect()
        })
        .collect();
    std::fs::write(path, serde_json::to_vec(&json)?)
}

/// Reads what [`save`] wrote.
pub fn load(path: &Path) -> Result<Vec<Vec<ChatMessage>>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let json: Vec<Vec<serde_json::Value>> =
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    json.iter()
        .map(|chat| {
            chat.iter()
                .map(|m| match (m["role"].as_str(), m["content"].as_str()) {
                    (Some(role), Some(content)) => Ok(ChatMessage::new(role, content)),
                    _ => Err(format!("a message without role or content: {m}")),
                })
                .collect()
        })
        .collect()
}

/// `args` (this app's, without the program) for the app started in its place: any
/// earlier [`FLAG`] left out, then [`FLAG`] `file`.
pub fn args_again(args: impl IntoIterator<Item = OsString>, file: &Path) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == FLAG {
            skip = true;
            continue;
        }
        if a.to_str()
            .is_some_and(|s| s.starts_with(&format!("{FLAG}=")))
        {
            continue;
        }
        out.push(a);
    }
    out.push(FLAG.into());
    out.push(file.into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_come_back_as_saved() {
        let chats = vec![
            vec![
                ChatMessage::new("user", "Hi \"there\"\n"),
                ChatMessage::new("assistant", "Hello! ✓"),
            ],
            vec![],
        ];
        let path = std::env::temp_dir().join(format!("wgllm-restore-{}.json", std::process::id()));
        save(&path, &chats).unwrap();
        assert_eq!(load(&path).unwrap(), chats);
        // An image's marker does not outlive the process that drew it.
        let marker = crate::engine::private_marker();
        let pictured = vec![vec![ChatMessage::new(
            "user",
            format!("{marker}What is it?"),
        )]];
        save(&path, &pictured).unwrap();
        assert_eq!(load(&path).unwrap()[0][0].content, "What is it?");
        std::fs::write(&path, r#"[[{"role": "user"}]]"#).unwrap();
        assert!(load(&path).unwrap_err().contains("without role or content"));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_command_line_again_names_the_new_file_once() {
        let args = [
            "app",
            "-m",
            "m.gguf",
            FLAG,
            "old.json",
            "-p",
            "hi",
            "--restore-chats=x",
        ];
        let again = args_again(args.iter().map(OsString::from), Path::new("new.json"));
        let again: Vec<&str> = again.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(again, ["app", "-m", "m.gguf", "-p", "hi", FLAG, "new.json"]);
    }
}
