//! Who is asking: the user a client certificate names (CN, and O as
//! groups), as upstream's x509 authenticator reads it.

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> Self {
        User { name: "system:anonymous".into(), groups: vec!["system:unauthenticated".into()] }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }

    /// From a verified client certificate's DER.
    pub fn from_certificate(der: &[u8]) -> Option<Self> {
        let (name, mut groups) = crate::pki::subject_of(der)?;
        groups.push("system:authenticated".into());
        Some(User { name, groups })
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}
