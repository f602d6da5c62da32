#include "daemon/trust/peer_identity.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"

namespace radixkv::daemon {

PeerIdentity PeerIdentity::InProcess() {
  PeerIdentity p;
  p.transport = Transport::kInProcess;
  p.address = "in-process";
  return p;
}

bool PeerIdentity::SameParty(const PeerIdentity& other) const {
  if (transport != other.transport) return false;
  switch (transport) {
    case Transport::kInProcess:
      return true;
    case Transport::kUnix:
      return uid == other.uid && pid == other.pid &&
             uid != static_cast<uid_t>(-1);
    case Transport::kTls:
      // Without a client certificate, the connection is all there is.
      if (subject.empty() || other.subject.empty()) {
        return subject.empty() && other.subject.empty() &&
               address == other.address;
      }
      return subject == other.subject;
    case Transport::kTcp:
      return address == other.address;
  }
  return false;
}

std::string PeerIdentity::ToString() const {
  switch (transport) {
    case Transport::kInProcess:
      return "in-process";
    case Transport::kUnix:
      return absl::StrCat("uid=", static_cast<int64_t>(static_cast<int>(uid)),
                          " gid=", static_cast<int>(gid), " pid=", pid);
    case Transport::kTls:
      return absl::StrCat("tls:", subject.empty() ? "(no certificate)" : subject,
                          " ", address);
    case Transport::kTcp:
      return absl::StrCat("tcp:", address);
  }
  return address;
}

std::string PeerIdentity::Principal() const {
  switch (transport) {
    case Transport::kInProcess:
      return "in-process";
    case Transport::kUnix:
      return absl::StrCat("uid:", static_cast<int>(uid));
    case Transport::kTls:
      return subject.empty() ? absl::StrCat("tls:", address)
                             : absl::StrCat("tls:", subject);
    case Transport::kTcp:
      return absl::StrCat("tcp:", address);
  }
  return address;
}

bool PeerIdentity::InGroup(gid_t g) const {
  return gid == g || std::find(groups.begin(), groups.end(), g) != groups.end();
}

void PeerRegistry::Add(int fd, const gpu::PeerCredentials& creds) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = creds;
}

bool PeerRegistry::Find(int fd, gpu::PeerCredentials* out) const {
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return false;
  *out = it->second;
  return true;
}

PeerIdentity IdentifyCall(const grpc::ServerContextBase& ctx,
                          const PeerRegistry* registry) {
  PeerIdentity p;
  p.address = ctx.peer();
  if (absl::StartsWith(p.address, "fd:")) {
    p.transport = PeerIdentity::Transport::kUnix;
    p.uid = static_cast<uid_t>(-1);
    p.gid = static_cast<gid_t>(-1);
    p.pid = -1;
    int fd = -1;
    gpu::PeerCredentials creds;
    if (registry != nullptr &&
        absl::SimpleAtoi(absl::string_view(p.address).substr(3), &fd) &&
        registry->Find(fd, &creds)) {
      p.uid = creds.uid;
      p.gid = creds.gid;
      p.groups = std::move(creds.groups);
      p.pid = creds.pid;
    }
    return p;
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    p.transport = PeerIdentity::Transport::kTls;
    std::vector<grpc::string_ref> ids = auth->GetPeerIdentity();
    if (!ids.empty()) p.subject.assign(ids.front().data(), ids.front().size());
    return p;
  }
  if (auth != nullptr) {
    // TLS without a verified client certificate.
    for (const grpc::string_ref& v :
         auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      if (std::string(v.data(), v.size()) == "ssl") {
        p.transport = PeerIdentity::Transport::kTls;
        return p;
      }
    }
  }
  p.transport = PeerIdentity::Transport::kTcp;
  return p;
}

}  // namespace radixkv::daemon
