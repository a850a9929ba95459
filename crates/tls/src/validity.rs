//! The validity period of tether's own certificates, checked whenever they are loaded (at
//! start-up and on every reload).
//!
//! A peer refuses a certificate outside its `notBefore`..`notAfter` period, so loading one
//! breaks every new handshake while the process looks healthy. rustls checks the period of
//! the peer's certificate only; the own chain is checked here, from the DER directly (the
//! same walk as [`crate::x509_version`], so v1 certificates are covered too), as kubelet's
//! certificate manager only rotates to certificates that are valid now.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls_pki_types::CertificateDer;

use crate::x509_version::{Tlv, validity};

const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// A point in time as certificates state it: whole seconds since the Unix epoch, shown in
/// RFC 3339 (`2026-12-03T09:00:00Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CertTime(i64);

impl CertTime {
    pub(crate) fn from_system(time: SystemTime) -> Self {
        match time.duration_since(UNIX_EPOCH) {
            Ok(after) => Self(i64::try_from(after.as_secs()).unwrap_or(i64::MAX)),
            Err(before) => Self(-i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX)),
        }
    }

    /// The same time as a [`SystemTime`].
    pub fn to_system(self) -> SystemTime {
        let magnitude = Duration::from_secs(self.0.unsigned_abs());
        if self.0 >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }
}

impl fmt::Display for CertTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (days, secs) = (self.0.div_euclid(86_400), self.0.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

/// How a certificate falls outside its validity period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsideValidity {
    /// `notAfter` has passed: only a new certificate helps.
    Expired { not_after: CertTime },
    /// `notBefore` is still ahead (a clock behind the issuer's): it will become valid then.
    NotYetValid { not_before: CertTime },
}

impl fmt::Display for OutsideValidity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired { not_after } => write!(f, "expired at {not_after} (notAfter)"),
            Self::NotYetValid { not_before } => {
                write!(f, "not valid before {not_before} (notBefore)")
            }
        }
    }
}

/// The first certificate of `chain` that is outside its validity period at `now`: its
/// position and how. A certificate whose period cannot be read is left to the peers, as
/// Go's `tls.LoadX509KeyPair` would load it.
pub(crate) fn first_outside(
    chain: &[CertificateDer<'_>],
    now: SystemTime,
) -> Option<(usize, OutsideValidity)> {
    let now = CertTime::from_system(now);
    chain.iter().enumerate().find_map(|(index, cert)| {
        let (not_before, not_after) = period(cert)?;
        if now > not_after {
            Some((index, OutsideValidity::Expired { not_after }))
        } else if now < not_before {
            Some((index, OutsideValidity::NotYetValid { not_before }))
        } else {
            None
        }
    })
}

/// `notBefore` and `notAfter` of a DER certificate.
fn period(cert: &[u8]) -> Option<(CertTime, CertTime)> {
    let not_before = Tlv::read(validity(cert)?)?;
    let not_after = Tlv::read(not_before.rest)?;
    Some((time(&not_before)?, time(&not_after)?))
}

/// A DER `UTCTime` (`YYMMDDHHMMSSZ`, years 1950-2049) or `GeneralizedTime`
/// (`YYYYMMDDHHMMSSZ`), the only forms RFC 5280 allows.
fn time(field: &Tlv<'_>) -> Option<CertTime> {
    let (year, rest) = match (field.tag, field.value.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&field.value[..2])?;
            (
                if yy >= 50 { 1900 + yy } else { 2000 + yy },
                &field.value[2..],
            )
        }
        (GENERALIZED_TIME, 15) => (digits(&field.value[..4])?, &field.value[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|at| digits(&rest[at..at + 2]));
    let (month, day) = (month?, day?);
    let (hour, minute, second) = (hour?, minute?, second?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // A leap second (60) is allowed by the encoding; it counts as the next second.
    if second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(CertTime(days * 86_400 + hour * 3600 + minute * 60 + second))
}

/// ASCII decimal digits as a number.
fn digits(text: &[u8]) -> Option<i64> {
    text.iter().try_fold(0i64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0'))
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(tag: u8, text: &str) -> Vec<u8> {
        let mut der = vec![tag, text.len() as u8];
        der.extend_from_slice(text.as_bytes());
        der
    }

    fn parse(tag: u8, text: &str) -> Option<String> {
        let der = tlv(tag, text);
        time(&Tlv::read(&der)?).map(|t| t.to_string())
    }

    #[test]
    fn both_time_forms_read_and_print_back() {
        assert_eq!(
            parse(UTC_TIME, "261203092207Z").as_deref(),
            Some("2026-12-03T09:22:07Z")
        );
        assert_eq!(
            parse(UTC_TIME, "500101000000Z").as_deref(),
            Some("1950-01-01T00:00:00Z")
        );
        assert_eq!(
            parse(GENERALIZED_TIME, "20491231235959Z").as_deref(),
            Some("2049-12-31T23:59:59Z")
        );
        assert_eq!(
            parse(GENERALIZED_TIME, "99991231235959Z").as_deref(),
            Some("9999-12-31T23:59:59Z")
        );
        assert_eq!(
            parse(GENERALIZED_TIME, "20240229120000Z").as_deref(),
            Some("2024-02-29T12:00:00Z")
        );
        assert_eq!(CertTime(0).to_string(), "1970-01-01T00:00:00Z");
        assert_eq!(CertTime(-1).to_string(), "1969-12-31T23:59:59Z");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_289_727);
        assert_eq!(CertTime::from_system(now).to_system(), now);
    }

    #[test]
    fn malformed_times_are_not_read() {
        for (tag, text) in [
            (UTC_TIME, "2612030922Z"),
            (UTC_TIME, "261203092207+0100"),
            (UTC_TIME, "261303092207Z"),
            (UTC_TIME, "261200092207Z"),
            (UTC_TIME, "261203242207Z"),
            (UTC_TIME, "26120309220xZ"),
            (GENERALIZED_TIME, "20261203092207.5Z"),
            (0x04, "261203092207Z"),
        ] {
            assert_eq!(parse(tag, text), None, "{text}");
        }
    }

    #[test]
    fn the_first_certificate_outside_its_period_is_found() {
        let pki = crate::pki::Pki::generate().unwrap();
        let der: CertificateDer<'_> =
            rustls_pki_types::pem::PemObject::from_pem_slice(pki.server_cert_pem.as_bytes())
                .unwrap();
        let (not_before, not_after) = period(&der).unwrap();
        let chain = [der];
        let at = |t: CertTime, offset: i64| CertTime(t.0 + offset).to_system();
        assert_eq!(
            first_outside(&chain, tether_observe::time::wall_clock()),
            None
        );
        assert_eq!(first_outside(&chain, at(not_after, 0)), None);
        assert_eq!(
            first_outside(&chain, at(not_after, 1)),
            Some((0, OutsideValidity::Expired { not_after }))
        );
        assert_eq!(
            first_outside(&chain, at(not_before, -1)),
            Some((0, OutsideValidity::NotYetValid { not_before }))
        );
        // Not a certificate: left to the peers.
        assert_eq!(
            first_outside(
                &[CertificateDer::from(vec![0x30, 0])],
                tether_observe::time::wall_clock()
            ),
            None
        );
    }
}
