//! Calendar time in UTC from a `SystemTime`, for the HTTP `Date` header and audit records,
//! without a date-time dependency; and [`wall_clock`], the one place that reads it.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The calendar clock, for what must agree with other machines: certificate validity, Lease
/// renewals, token expiry, audit and log timestamps. Durations and deadlines read tokio's
/// monotonic clock instead (`clippy.toml` holds the rule), so paused-time tests control them.
#[expect(clippy::disallowed_methods, reason = "the one read of calendar time")]
pub fn wall_clock() -> SystemTime {
    SystemTime::now()
}

/// Monotonic time from tokio's clock, as the `std` instant the session core takes: a test
/// with paused time moves it (std's own clock it could not).
pub fn monotonic_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A UTC instant broken into calendar fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    /// 1–12.
    pub month: u32,
    /// 1–31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub millisecond: u32,
    /// 0 = Sunday … 6 = Saturday.
    pub weekday: u32,
}

impl Civil {
    /// The calendar fields of `time` (instants before 1970 read as the epoch).
    pub fn from_system_time(time: SystemTime) -> Self {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let days = (secs / 86_400) as i64;
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        Self {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: ((secs % 86_400) / 3600) as u32,
            minute: ((secs % 3600) / 60) as u32,
            second: (secs % 60) as u32,
            millisecond: since.subsec_millis(),
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as u32,
        }
    }

    /// RFC 3339 with milliseconds, e.g. `2026-12-01T13:20:45.123Z`.
    pub fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.millisecond
        )
    }

    /// An RFC 7231 IMF-fixdate, as Go's `http.TimeFormat`: `Thu, 01 Jan 1970 00:00:00 GMT`.
    pub fn http_date(&self) -> String {
        const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        format!(
            "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
            WEEKDAYS[self.weekday as usize],
            self.day,
            MONTHS[(self.month - 1) as usize],
            self.year,
            self.hour,
            self.minute,
            self.second
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64, millis: u64) -> Civil {
        Civil::from_system_time(UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis))
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(at(0, 0).http_date(), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            at(1_795_000_000, 0).http_date(),
            "Wed, 18 Nov 2026 11:06:40 GMT"
        );
        assert_eq!(
            at(1_709_208_000, 0).http_date(),
            "Thu, 29 Feb 2024 12:00:00 GMT"
        );
        assert_eq!(at(1_709_208_000, 7).rfc3339(), "2024-02-29T12:00:00.007Z");
        assert_eq!(at(951_782_400, 999).rfc3339(), "2000-02-29T00:00:00.999Z");
    }
}
