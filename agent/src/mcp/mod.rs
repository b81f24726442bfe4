//! MCP tool packages inside a Computer (SPEC §6): the archive reader ([`archive`]) and the
//! installer ([`install`]) that checks a package's digest before unpacking, unpacks into a
//! staging directory and publishes it only once every check passed.

pub mod archive;
pub mod bindings;
pub mod install;
pub mod results;
pub mod runner;
