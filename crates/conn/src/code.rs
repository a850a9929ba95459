//! gRPC's status codes: how a stream is refused or ended on every transport, the native
//! link's CLOSE frame included, so logs and metrics name them alike.

/// A gRPC status code. Only the codes tether produces or reports are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32);

impl Code {
    pub const OK: Self = Self(0);
    pub const CANCELLED: Self = Self(1);
    pub const UNKNOWN: Self = Self(2);
    pub const INVALID_ARGUMENT: Self = Self(3);
    pub const DEADLINE_EXCEEDED: Self = Self(4);
    pub const ALREADY_EXISTS: Self = Self(6);
    pub const PERMISSION_DENIED: Self = Self(7);
    pub const RESOURCE_EXHAUSTED: Self = Self(8);
    pub const FAILED_PRECONDITION: Self = Self(9);
    pub const UNIMPLEMENTED: Self = Self(12);
    pub const INTERNAL: Self = Self(13);
    pub const UNAVAILABLE: Self = Self(14);
    pub const UNAUTHENTICATED: Self = Self(16);

    /// grpc-go's spelling, used in metric labels.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "Canceled",
            "Unknown",
            "InvalidArgument",
            "DeadlineExceeded",
            "NotFound",
            "AlreadyExists",
            "PermissionDenied",
            "ResourceExhausted",
            "FailedPrecondition",
            "Aborted",
            "OutOfRange",
            "Unimplemented",
            "Internal",
            "Unavailable",
            "DataLoss",
            "Unauthenticated",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("Unknown")
    }
}
