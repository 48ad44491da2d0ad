//! PCI bus addresses (`dddd:bb:ss.f`).

use std::fmt;
use std::str::FromStr;

/// A PCI address: domain, bus, slot (device) and function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BusId {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Slot (device) number, 0..=31.
    pub slot: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// A PCI address that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI bus id {0:?} (expected dddd:bb:ss.f, e.g. 0000:18:00.0)")]
pub struct BusIdError(pub String);

impl BusId {
    /// The sysfs name of the root complex this device hangs off (`pci0008:06`).
    pub fn root_complex(&self) -> String {
        format!("pci{:04x}:{:02x}", self.domain, self.bus)
    }

    /// The device's sysfs directory, relative to `/sys` (`devices/pci0008:06/0008:06:00.0`).
    pub fn sysfs_device_path(&self) -> String {
        format!("devices/{}/{self}", self.root_complex())
    }
}

impl fmt::Display for BusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.function
        )
    }
}

impl FromStr for BusId {
    type Err = BusIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || BusIdError(s.to_string());
        let (domain, rest) = s.split_once(':').ok_or_else(err)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(err)?;
        let (slot, function) = rest.split_once('.').ok_or_else(err)?;
        let hex = |v: &str, len: usize| {
            if v.len() == len && v.bytes().all(|b| b.is_ascii_hexdigit()) {
                u32::from_str_radix(v, 16).map_err(|_| err())
            } else {
                Err(err())
            }
        };
        let id = BusId {
            domain: hex(domain, 4)? as u16,
            bus: hex(bus, 2)? as u8,
            slot: hex(slot, 2)? as u8,
            function: hex(function, 1)? as u8,
        };
        if id.slot > 31 || id.function > 7 {
            return Err(err());
        }
        Ok(id)
    }
}

impl serde::Serialize for BusId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for BusId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let id: BusId = "0008:06:00.0".parse().unwrap();
        assert_eq!(id.to_string(), "0008:06:00.0");
        assert_eq!(id.sysfs_device_path(), "devices/pci0008:06/0008:06:00.0");
        assert_eq!(
            "0000:C5:00.0".parse::<BusId>().unwrap().to_string(),
            "0000:c5:00.0"
        );
        for bad in [
            "",
            "0:0:0.0",
            "0000:00:20.0",
            "0000:00:00.8",
            "0000:zz:00.0",
            "0000:00:00",
        ] {
            assert!(bad.parse::<BusId>().is_err(), "{bad}");
        }
    }
}
