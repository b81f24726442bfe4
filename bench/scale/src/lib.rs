//! The state of issue 15's size, built directly through the state machine's commands in bulk
//! (no Raft, no HTTP: through the API it would take hours on 2 cores): running provider
//! Computers with idle-plan entries (a create each), finished executions (pause/resume pairs),
//! and tool bindings of one bot.
//!
//! [`World::new`] starts from an empty state of its own (scale-bench); [`World::on`] starts from a
//! node's state, as its owner, and can keep every request it applied ([`World::log`]) so that
//! they can be applied again, in order, through that node's store (join-bench).

use computerd_raft::sm::BindingState;
use computerd_raft::sm::Bot;
use computerd_raft::sm::CEILING_LIVE_COMPUTERS_PER_MEMBER;
use computerd_raft::sm::Command;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Execution;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::Limits;
use computerd_raft::sm::Member;
use computerd_raft::sm::Organization;
use computerd_raft::sm::Outcome;
use computerd_raft::sm::Principal;
use computerd_raft::sm::Provider;
use computerd_raft::sm::ProviderKind;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::Role;
use computerd_raft::sm::Source;
use computerd_raft::sm::State;
use computerd_raft::sm::Submit;
use computerd_raft::sm::Token;
use computerd_raft::sm::ToolBinding;
use computerd_raft::sm::hash_secret;

/// The owner token of a state built from empty.
pub const OWNER: &str = "tok_owner";
/// The token of the bot the bindings belong to.
pub const BOT_TOKEN: &str = "tok_bot";
/// The bot the bindings belong to.
pub const BOT: &str = "bot_1";
/// The provider of every Computer.
pub const PROVIDER: &str = "cpp_1";
/// Bindings per Computer that carries them (the store's cap is 64).
pub const BINDINGS_PER_COMPUTER: usize = 50;

/// How much state to build.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Running Computers, each with an idle-plan entry.
    pub computers: usize,
    /// Finished executions (the creates included).
    pub executions: usize,
    /// Tool bindings.
    pub bindings: usize,
}

impl Size {
    /// Issue 15's size times `fraction`.
    pub fn full(fraction: f64) -> Self {
        Size {
            computers: (100_000.0 * fraction) as usize,
            executions: (1_000_000.0 * fraction) as usize,
            bindings: (10_000.0 * fraction) as usize,
        }
    }
}

/// A state being built, with the cluster's clock it stamps entries with.
pub struct World {
    /// The state.
    pub s: State,
    /// The clock of the last entry applied (one millisecond per entry, as a busy leader's).
    pub clock: u64,
    n: u64,
    /// The token id commands are given by (an owner's).
    owner: String,
    /// That owner's member id.
    member: String,
    /// Every request applied, in order, when kept.
    pub log: Option<Vec<Request>>,
    /// Milliseconds the clock moves per entry (1, as a busy leader's; 0 stamps a whole seeding
    /// with one time).
    pub tick: u64,
    /// The Computers' idle pause, seconds.
    pub pause_after: u64,
}

impl World {
    /// An empty state of its own: an organization, its owner ([`OWNER`]), the provider, the bot.
    pub fn new() -> Self {
        let mut w = World {
            s: State::default(),
            clock: 1_800_000_000_000,
            n: 0,
            owner: OWNER.into(),
            member: "mem_o".into(),
            log: None,
            tick: 1,
            pause_after: 600,
        };
        let owner = Member { id: "mem_o".into(), name: "o".into(), email: None, role: Role::Owner, created_at: 1 };
        w.must(Command::Bootstrap {
            cluster_id: "c".into(),
            org: Organization { id: "org".into(), name: "o".into(), created_at: 1 },
            owner,
            token: token(OWNER, Principal::Member("mem_o".into())),
            join_secret_hash: None,
        });
        w.furnish();
        w
    }

    /// Goes on from a node's `state`, as the owner whose secret is `owner_secret`, stamping from
    /// `clock` on (at or past the state's own clock); keeps every request it applies in
    /// [`World::log`].
    pub fn on(state: State, owner_secret: &str, clock: u64) -> Result<Self, String> {
        let hash = hash_secret(owner_secret);
        let (owner, member) = state
            .tokens
            .values()
            .find_map(|t| match &t.principal {
                Principal::Member(m) if t.hash == hash && t.revoked_at.is_none() => Some((t.id.clone(), m.clone())),
                _ => None,
            })
            .ok_or("no live member token of the state has that secret")?;
        if state.members.get(&member).is_none_or(|m| m.role != Role::Owner) {
            return Err(format!("the token's member {member} is not an owner"));
        }
        let clock = clock.max(state.clock);
        let mut w = World { s: state, clock, n: 0, owner, member, log: Some(Vec::new()), tick: 1, pause_after: 600 };
        w.furnish();
        Ok(w)
    }

    /// The provider, the bot and its token, and room for 100,000 Computers of one member.
    fn furnish(&mut self) {
        let limits =
            Limits { live_computers_per_member: Some(CEILING_LIVE_COMPUTERS_PER_MEMBER), ..Default::default() };
        self.must(Command::SetLimits { by: self.owner.clone(), limits });
        let provider = Provider {
            id: PROVIDER.into(),
            kind: ProviderKind::Fake,
            name: "p".into(),
            config: Default::default(),
            secrets: Default::default(),
            created_by: self.member.clone(),
            created_at: 1,
        };
        self.must(Command::CreateProvider { by: self.owner.clone(), provider });
        let bot =
            Bot { id: BOT.into(), name: "b".into(), member_id: self.member.clone(), created_at: 1, archived_at: None };
        self.must(Command::CreateBot { by: self.owner.clone(), bot, parent: None });
        self.must(Command::CreateToken { by: self.owner.clone(), token: token(BOT_TOKEN, Principal::Bot(BOT.into())) });
    }

    /// The token id commands are given by.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The owner's member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// Applies `cmd`, stamped [`World::tick`] after the last entry.
    pub fn apply(&mut self, cmd: Command) -> Response {
        self.clock += self.tick;
        let req = Request::new(cmd).stamped(self.clock);
        let r = self.s.apply_request(&req);
        if let Some(log) = &mut self.log {
            log.push(req);
        }
        r
    }

    /// Applies a command that must succeed; answers the id it named.
    pub fn must(&mut self, cmd: Command) -> Option<String> {
        let name = cmd.name();
        match self.apply(cmd) {
            Response::Ok => None,
            Response::Id(id) => Some(id),
            Response::Rejected(r) => panic!("{name} refused while building the state: {r:?}"),
        }
    }

    fn next(&mut self) -> u64 {
        self.n += 1;
        self.n
    }

    /// The submit of an execution of `kind` on `computer` (with the Computer for a create).
    pub fn submit(&mut self, kind: ExecutionKind, computer: &str) -> Command {
        let n = self.next();
        let exe = Execution::pending(&format!("exe_{n:012}"), &format!("key-{n}"), "body", kind, computer, self.clock);
        let c = (kind == ExecutionKind::Create).then(|| Computer {
            id: computer.into(),
            name: computer.into(),
            owner: self.member.clone(),
            shared: false,
            source: Source::Provider { provider: PROVIDER.into(), template: None },
            desktop: false,
            pause_after: Some(self.pause_after),
            state: ComputerState::Starting,
            sandbox: None,
            active_execution: None,
            created_at: self.clock,
            agent_credential: None,
            link_generation: 0,
            link_node: None,
            desktop_view: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
            egress_denied_through: 0,
            egress_revision: 0,
            pooled: false,
        });
        Command::SubmitExecution(Box::new(Submit {
            by: self.owner.clone(),
            execution: exe,
            computer: c,
            approval_id: format!("apr_{n:012}"),
            reason: None,
            at_ms: self.clock,
        }))
    }

    /// The steps of one execution after its submit: claim, dispatch, finish.
    pub fn steps(&self, exe: &str) -> [Command; 3] {
        let at_ms = self.clock;
        [
            Command::ClaimExecution { execution_id: exe.into(), claim: "k".into(), node: None, at_ms },
            Command::DispatchExecution { execution_id: exe.into(), claim: "k".into(), at_ms },
            Command::FinishExecution {
                execution_id: exe.into(),
                claim: "k".into(),
                outcome: Outcome::Succeeded { sandbox: Some(format!("sbx-{exe}")) },
                at_ms,
            },
        ]
    }

    /// Submits and runs one execution to success.
    pub fn run(&mut self, kind: ExecutionKind, computer: &str) {
        let cmd = self.submit(kind, computer);
        let exe = self.must(cmd).expect("an execution id");
        for step in self.steps(&exe) {
            self.must(step);
        }
    }

    /// A new binding of the bot on `computer`.
    pub fn binding(&mut self, computer: &str) -> ToolBinding {
        let n = self.next();
        ToolBinding {
            id: format!("bnd_{n:012}"),
            bot_id: BOT.into(),
            computer_id: computer.into(),
            package_id: format!("pkg-{}", n % 97),
            version: "1.0.0".into(),
            sha256: format!("{n:064x}"),
            state: BindingState::Installing,
            tools: serde_json::Value::Null,
            error: None,
            created_at: self.clock,
            shared_uid: false,
            install_key: None,
            request_hash: None,
        }
    }

    /// Grants the bot `computer` (so that it may bind tools there).
    pub fn grant(&mut self, computer: &str) {
        self.must(Command::PutGrant {
            by: self.owner.clone(),
            computer_id: computer.into(),
            bot_id: BOT.into(),
            at_ms: self.clock,
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
        });
    }

    /// Builds `size` on top of what is there.
    pub fn populate(&mut self, size: Size) {
        for i in 0..size.computers {
            self.run(ExecutionKind::Create, &computer_id(i));
        }
        // Pause/resume pairs, spread over the Computers, until the executions are there (an even
        // count leaves every Computer running, so every one keeps its plan entry).
        let mut left = size.executions.saturating_sub(size.computers);
        let mut i = 0;
        while left >= 2 {
            let c = computer_id(i % size.computers);
            self.run(ExecutionKind::Pause, &c);
            self.run(ExecutionKind::Resume, &c);
            left -= 2;
            i += 1;
        }
        let carriers = size.bindings.div_ceil(BINDINGS_PER_COMPUTER);
        for k in 0..carriers {
            let c = computer_id(k);
            self.grant(&c);
            for _ in 0..BINDINGS_PER_COMPUTER.min(size.bindings - k * BINDINGS_PER_COMPUTER) {
                let b = self.binding(&c);
                let id = b.id.clone();
                self.must(Command::BindingReserve { by: BOT_TOKEN.into(), binding: b });
                self.must(Command::BindingSettle {
                    binding_id: id,
                    ready: true,
                    tools: serde_json::json!([{"name": "echo"}]),
                    error: None,
                    shared_uid: false,
                });
            }
        }
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

/// A token record for the raw secret `id`.
pub fn token(id: &str, principal: Principal) -> Token {
    Token {
        id: id.into(),
        name: id.into(),
        hash: hash_secret(id),
        principal,
        read_only: false,
        computers: None,
        created_at: 1,
        revoked_at: None,
    }
}

/// The id of the `i`th Computer built.
pub fn computer_id(i: usize) -> String {
    format!("cmp_{i:08}")
}

/// The resident set of this process, bytes.
pub fn rss() -> u64 {
    status_kib("/proc/self/status", "VmRSS:") * 1024
}

/// A `kB` field of a `/proc/<pid>/status` file (0 when it cannot be read).
pub fn status_kib(path: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(path).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
}
