//! The file-operation protocol, defined once: the statuses a file operation ends with, whether
//! the executor does it natively (`executor.py`) or a shell script does it (`workspace.rs`, and
//! one exec per call). Both are given these numbers from here — the scripts as shell
//! variables, the executor as Python constants — so the two cannot drift apart.

/// How a file operation ended, other than success (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FsStatus {
    /// The path cannot be resolved (a link loop, a name the OS refuses).
    CannotResolve = 90,
    /// It resolves outside `/workspace`; the resolved path is on stderr.
    Outside = 91,
    NotFound = 92,
    IsDirectory = 93,
    NotRegular = 94,
    PermissionDenied = 95,
    /// `create` found something there already.
    Exists = 96,
    /// Anything else; the reason is on stderr.
    Failed = 97,
    /// The image has no ripgrep.
    NoRipgrep = 99,
}

impl FsStatus {
    pub const ALL: [FsStatus; 9] = [
        FsStatus::CannotResolve,
        FsStatus::Outside,
        FsStatus::NotFound,
        FsStatus::IsDirectory,
        FsStatus::NotRegular,
        FsStatus::PermissionDenied,
        FsStatus::Exists,
        FsStatus::Failed,
        FsStatus::NoRipgrep,
    ];

    pub fn code(self) -> i64 {
        self as u8 as i64
    }

    pub fn from_code(code: i64) -> Option<FsStatus> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The constant's name in both languages: `E_NOT_FOUND`.
    fn name(self) -> &'static str {
        match self {
            FsStatus::CannotResolve => "E_CANNOT_RESOLVE",
            FsStatus::Outside => "E_OUTSIDE",
            FsStatus::NotFound => "E_NOT_FOUND",
            FsStatus::IsDirectory => "E_IS_DIRECTORY",
            FsStatus::NotRegular => "E_NOT_REGULAR",
            FsStatus::PermissionDenied => "E_PERMISSION_DENIED",
            FsStatus::Exists => "E_EXISTS",
            FsStatus::Failed => "E_FAILED",
            FsStatus::NoRipgrep => "E_NO_RIPGREP",
        }
    }
}

/// `E_NOT_FOUND=92 ...`: the first line of every file-operation script.
pub fn shell_preamble() -> String {
    let vars: Vec<String> = FsStatus::ALL
        .iter()
        .map(|s| format!("{}={}", s.name(), s.code()))
        .collect();
    format!("{}\n", vars.join(" "))
}

/// `E_NOT_FOUND = 92` lines, put before the executor's source.
pub(crate) fn python_preamble() -> String {
    FsStatus::ALL
        .iter()
        .map(|s| format!("{} = {}\n", s.name(), s.code()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_both_languages_get_every_one() {
        for s in FsStatus::ALL {
            assert_eq!(FsStatus::from_code(s.code()), Some(s));
            assert!(shell_preamble().contains(&format!("{}={}", s.name(), s.code())));
            assert!(python_preamble().contains(&format!("{} = {}\n", s.name(), s.code())));
        }
        assert_eq!(FsStatus::from_code(0), None);
        assert_eq!(FsStatus::from_code(1), None);
    }

    #[test]
    fn no_number_is_written_where_a_name_belongs() {
        // The executor's source uses the names only.
        for s in FsStatus::ALL {
            assert!(
                !super::super::executor::SOURCE.contains(&format!("result({})", s.code())),
                "executor.py writes {} as a number",
                s.name()
            );
        }
    }
}
