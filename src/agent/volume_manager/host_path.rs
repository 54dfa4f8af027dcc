//! hostPath: nothing to materialise, only upstream's `type` checks
//! (DirectoryOrCreate makes a 0755 directory, FileOrCreate a 0644 file;
//! the other types must already exist and be of that kind).

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::error::SetUpError;

fn not_a(path: &str, what: &'static str) -> SetUpError {
    SetUpError::HostPathType { path: path.to_string(), what }
}

/// Checks (and for the `OrCreate` types, makes) `path` as `kind` says.
pub fn check_type(path: &str, kind: Option<&str>) -> Result<(), SetUpError> {
    if path.split('/').any(|c| c == "..") {
        return Err(SetUpError::HostPathBacksteps(path.to_string()));
    }
    let kind = kind.unwrap_or_default();
    if kind.is_empty() {
        return Ok(());
    }
    // Links are followed, as upstream's os.Stat.
    let meta = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(SetUpError::io(path)(e)),
    };
    let ft = meta.as_ref().map(|m| m.file_type());
    match kind {
        "DirectoryOrCreate" if meta.is_none() => {
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(path).map_err(SetUpError::io(path))
        }
        "DirectoryOrCreate" | "Directory" => {
            ft.filter(|t| t.is_dir()).map(|_| ()).ok_or_else(|| not_a(path, "directory"))
        }
        "FileOrCreate" if meta.is_none() => {
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(path) {
                Ok(_) => Ok(()),
                // Made by someone else in the meantime: check what it is.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => check_type(path, Some("File")),
                Err(e) => Err(SetUpError::io(path)(e)),
            }
        }
        "FileOrCreate" | "File" => ft.filter(|t| t.is_file()).map(|_| ()).ok_or_else(|| not_a(path, "file")),
        "Socket" => ft.filter(|t| t.is_socket()).map(|_| ()).ok_or_else(|| not_a(path, "socket file")),
        "CharDevice" => ft.filter(|t| t.is_char_device()).map(|_| ()).ok_or_else(|| not_a(path, "character device")),
        "BlockDevice" => ft.filter(|t| t.is_block_device()).map(|_| ()).ok_or_else(|| not_a(path, "block device")),
        other => Err(SetUpError::InvalidHostPathType(other.to_string())),
    }
}

/// Whether `path` exists (for local persistent volumes).
pub fn exists(path: &Path) -> bool {
    std::fs::metadata(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn types_are_checked_and_created_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let p = |s: &str| dir.path().join(s).to_str().unwrap().to_string();
        std::fs::write(p("file"), "x").unwrap();

        assert!(check_type(&p("anything"), None).is_ok());
        assert!(check_type(&p("anything"), Some("")).is_ok());
        assert!(check_type(&p("file"), Some("File")).is_ok());
        assert_eq!(
            check_type(&p("file"), Some("Directory")).unwrap_err().to_string(),
            format!("hostPath type check failed: {} is not a directory", p("file"))
        );
        assert_eq!(
            check_type(&p("missing"), Some("File")).unwrap_err().to_string(),
            format!("hostPath type check failed: {} is not a file", p("missing"))
        );
        assert!(check_type(&p("file"), Some("Socket")).unwrap_err().to_string().ends_with("is not a socket file"));
        assert!(check_type("/dev/null", Some("CharDevice")).is_ok());
        assert!(check_type("/dev/null", Some("BlockDevice"))
            .unwrap_err()
            .to_string()
            .ends_with("is not a block device"));
        assert!(check_type(&p("file"), Some("Weird")).is_err());
        assert!(check_type("/tmp/../etc", None).is_err());

        check_type(&p("new/dir"), Some("DirectoryOrCreate")).unwrap();
        assert_eq!(std::fs::metadata(p("new/dir")).unwrap().mode() & 0o7777, 0o755);
        check_type(&p("new/dir"), Some("DirectoryOrCreate")).unwrap();
        assert!(check_type(&p("file"), Some("DirectoryOrCreate")).is_err());

        check_type(&p("new/file"), Some("FileOrCreate")).unwrap();
        assert_eq!(std::fs::metadata(p("new/file")).unwrap().mode() & 0o7777, 0o644);
        assert!(check_type(&p("new/dir"), Some("FileOrCreate")).is_err());
    }
}
