//! The `name:key=value,...` specs of `--topology` and `--flows`: one parser
//! for both, so a spec's errors read the same wherever it is written.

use crate::{parse_rate, parse_time, Error, Ps};

/// The `key=value` list after a spec's name; each key is taken once, and
/// [`Params::done`] refuses any left over.
pub(crate) struct Params<'a> {
    spec: &'a str,
    kv: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    pub(crate) fn parse(spec: &'a str, rest: &'a str) -> Result<Params<'a>, Error> {
        let mut kv = Vec::new();
        for item in rest.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| Error::new(format!("{spec}: `{item}` is not key=value")))?;
            kv.push((k.trim(), v.trim()));
        }
        Ok(Params { spec, kv })
    }

    pub(crate) fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.kv.iter().position(|(k, _)| *k == key)?;
        Some(self.kv.remove(i).1)
    }

    pub(crate) fn req(&mut self, key: &str) -> Result<&'a str, Error> {
        self.take(key)
            .ok_or_else(|| Error::new(format!("{}: {key}= is required", self.spec)))
    }

    pub(crate) fn count(&mut self, key: &str, default: Option<usize>) -> Result<usize, Error> {
        match self.take(key) {
            Some(v) => v
                .parse()
                .map_err(|_| Error::new(format!("{}: {key}={v} is not a count", self.spec))),
            None => default.ok_or_else(|| Error::new(format!("{}: {key}= is required", self.spec))),
        }
    }

    pub(crate) fn rate(&mut self, key: &str, default: u64) -> Result<u64, Error> {
        self.take(key).map_or(Ok(default), parse_rate)
    }

    pub(crate) fn time(&mut self, key: &str, default: Ps) -> Result<Ps, Error> {
        self.take(key).map_or(Ok(default), parse_time)
    }

    pub(crate) fn done(self) -> Result<(), Error> {
        match self.kv.first() {
            Some((k, _)) => Err(Error::new(format!(
                "{}: unknown parameter `{k}`",
                self.spec
            ))),
            None => Ok(()),
        }
    }
}
