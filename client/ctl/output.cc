#include "client/ctl/output.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <ios>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "base/bytes.h"
#include "nlohmann/json.hpp"

namespace radixkv::ctl {
namespace {

// One decimal, dropping a trailing ".0".
std::string OneDecimal(double v) {
  std::string s = absl::StrFormat("%.1f", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

}  // namespace

std::string HumanBytes(uint64_t bytes) { return radixkv::HumanBytes(bytes); }

std::string HumanCount(uint64_t n) {
  if (n < 1000) return absl::StrCat(n);
  static constexpr const char* kUnits[] = {"", "k", "M", "G", "T", "P"};
  double v = static_cast<double>(n);
  int unit = 0;
  while (v >= 1000 && unit < 5) {
    v /= 1000;
    ++unit;
  }
  return absl::StrCat(OneDecimal(v), kUnits[unit]);
}

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0)) return "-";
  if (seconds < 1) return absl::StrCat(static_cast<int64_t>(seconds * 1000), "ms");
  const auto s = static_cast<int64_t>(seconds);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  return absl::StrCat(s / 86400, "d", (s % 86400) / 3600, "h");
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) /
                                       static_cast<double>(whole));
}

std::string Hex(absl::string_view bytes, size_t max_chars) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  if (max_chars > 0 && out.size() > max_chars) out.resize(max_chars);
  return out;
}

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::ordered_json;

void RewriteMessage(const Descriptor& type, Json* object);

// Rewrites one value of `field` as ToJsonLine describes. A value that is not
// in the form protobuf's printer gives is left as it is.
void RewriteValue(const FieldDescriptor& field, Json* value) {
  if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    RewriteMessage(*field.message_type(), value);
    return;
  }
  if (!value->is_string()) return;
  const std::string& text = value->get_ref<const std::string&>();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t n = 0;
      if (absl::SimpleAtoi(text, &n)) *value = n;
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t n = 0;
      if (absl::SimpleAtoi(text, &n)) *value = n;
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string raw;
      if (field.type() == FieldDescriptor::TYPE_BYTES &&
          absl::Base64Unescape(text, &raw)) {
        *value = Hex(raw);
      }
      break;
    }
    default:
      break;
  }
}

// Rewrites the fields of `object`, the protobuf JSON form of a `type`
// message printed with proto field names.
void RewriteMessage(const Descriptor& type, Json* object) {
  if (!object->is_object() || type.file()->package() == "google.protobuf") {
    return;  // well-known types have JSON forms of their own
  }
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor& field = *type.field(i);
    auto it = object->find(field.name());
    if (it == object->end()) continue;
    if (field.is_map()) {
      // {"key": value, ...}: keys are strings in every form; rewrite values.
      const FieldDescriptor& value_field = *field.message_type()->map_value();
      for (Json& v : *it) RewriteValue(value_field, &v);
    } else if (field.is_repeated()) {
      for (Json& v : *it) RewriteValue(field, &v);
    } else {
      RewriteValue(field, &*it);
    }
  }
}

}  // namespace

std::string ToJsonLine(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  Json json = status.ok()
                  ? Json::parse(out, nullptr, /*allow_exceptions=*/false)
                  : Json(Json::value_t::discarded);
  if (json.is_discarded()) {
    Json error;
    error["error"] =
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON");
    return error.dump();
  }
  RewriteMessage(*message.GetDescriptor(), &json);
  return json.dump(-1, ' ', /*ensure_ascii=*/false,
                   Json::error_handler_t::replace);
}

namespace {

// The iword slot of SetHeaders: nonzero when headers are off, so that a
// stream nobody configured prints them.
int NoHeadersSlot() {
  static const int slot = std::ios_base::xalloc();
  return slot;
}

}  // namespace

void SetHeaders(std::ostream& out, bool on) {
  out.iword(NoHeadersSlot()) = on ? 0 : 1;
}

bool Headers(std::ostream& out) { return out.iword(NoHeadersSlot()) == 0; }

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), right_(header_.size(), false) {}

void Table::AlignRight(std::vector<size_t> columns) {
  for (size_t c : columns) {
    if (c < right_.size()) right_[c] = true;
  }
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      const bool last = c + 1 == row.size();
      if (right_[c]) {
        line.append(pad, ' ');
        line += row[c];
      } else {
        line += row[c];
        if (!last) line.append(pad, ' ');
      }
      if (!last) line += "  ";
    }
    out << line << "\n";
  };
  if (Headers(out)) print_row(header_);
  for (const auto& row : rows_) print_row(row);
}

void KeyValueList::Add(std::string key, std::string value) {
  items_.emplace_back(std::move(key), std::move(value));
}

void KeyValueList::Print(std::ostream& out) const {
  size_t width = 0;
  for (const auto& [k, v] : items_) width = std::max(width, k.size());
  for (const auto& [k, v] : items_) {
    out << k << ":" << std::string(width - k.size() + 2, ' ') << v << "\n";
  }
}

// ---- shell completion ------------------------------------------------------

namespace {

// `s` single-quoted for the shell: 'it'\''s'.
std::string ShellQuote(absl::string_view s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

constexpr char kBashHead[] =
    R"sh(# bash completion for radixkvctl (`radixkvctl completion bash`).
# Load it in this shell:  source <(radixkvctl completion bash)
# or in every shell, save it as /etc/bash_completion.d/radixkvctl.

# Sets COMPREPLY to what compgen "$@" offers for $cur.
__radixkvctl_reply() {
  [[ $1 == -f ]] && compopt -o filenames 2>/dev/null
  mapfile -t COMPREPLY < <(compgen "$@" -- "$cur")
}

# Whether flag $2 of command $1 takes a value.
__radixkvctl_takes_value() {
  [[ " $(__radixkvctl_value_flags "$1") " == *" $2 "* ]]
}
)sh";

constexpr char kBashMain[] = R"sh(
_radixkvctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local flag='' cmd='' i w
  COMPREPLY=()
  # bash splits "--flag=value" at "=" (COMP_WORDBREAKS): "--flag" "=" "value".
  if [[ $cur == = ]]; then
    flag=$prev cur=''
  elif [[ $prev == = ]] && ((COMP_CWORD >= 2)); then
    flag=${COMP_WORDS[COMP_CWORD-2]}
  fi
  # The command: the first word that is neither a flag nor a flag's value.
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [[ $w == = ]]; then
      ((i++))
    elif [[ $w == -* ]]; then
      if [[ ${COMP_WORDS[i+1]} != = ]] && __radixkvctl_takes_value '' "$w"; then
        ((i++))
      fi
    else
      cmd=$w
      break
    fi
  done
  if [[ -z $flag && $prev == -* ]] &&
    __radixkvctl_takes_value "$cmd" "$prev"; then
    flag=$prev  # "--flag value"
  fi
  if [[ -n $flag ]]; then
    __radixkvctl_values "$cmd" "$flag"
  elif [[ $cur == -* ]]; then
    __radixkvctl_reply -W "$(__radixkvctl_flags "$cmd")"
    if [[ ${#COMPREPLY[@]} == 1 && ${COMPREPLY[0]} == *= ]]; then
      compopt -o nospace 2>/dev/null
    fi
  else
    __radixkvctl_args "$cmd"
  fi
  return 0
}

complete -F _radixkvctl radixkvctl
)sh";

// A bash function of a command name: a `case` arm per command for which
// `arm` gives a body; with `with_globals`, the body `arm` gives for the
// global flags runs after the case, for every command.
std::string BashCase(const CompletionModel& m, const std::string& function,
                     const std::string& comment,
                     std::string (*arm)(const std::vector<CompletionItem>&),
                     bool with_globals) {
  std::string out = absl::StrCat("\n# ", comment, "\n", function, "() {\n",
                                 "  case $1 in\n");
  for (const CompletionCommand& c : m.commands) {
    const std::string body = arm(c.flags);
    if (body.empty()) continue;
    absl::StrAppend(&out, "    ", c.name, ") ", body, " ;;\n");
  }
  absl::StrAppend(&out, "  esac\n");
  if (with_globals) absl::StrAppend(&out, "  ", arm(m.globals), "\n");
  return out + "}\n";
}

// "echo '--limit= --no-headers'": every flag name, "--name=" where a long
// flag takes a value.
std::string BashFlagWords(const std::vector<CompletionItem>& flags) {
  std::vector<std::string> words;
  for (const CompletionItem& f : flags) {
    for (const std::string& n : f.names) {
      words.push_back(f.takes_value && absl::StartsWith(n, "--") ? n + "=" : n);
    }
  }
  return words.empty() ? "" : "echo " + ShellQuote(absl::StrJoin(words, " "));
}

// "echo '--limit --max-depth'": the names of the flags that take a value.
std::string BashValueFlags(const std::vector<CompletionItem>& flags) {
  std::vector<std::string> names;
  for (const CompletionItem& f : flags) {
    if (!f.takes_value) continue;
    names.insert(names.end(), f.names.begin(), f.names.end());
  }
  return names.empty() ? "" : "echo " + ShellQuote(absl::StrJoin(names, " "));
}

// The reply for the value of `item`.
std::string BashReply(const CompletionItem& item) {
  if (item.paths) return "__radixkvctl_reply -f";
  return "__radixkvctl_reply -W " + ShellQuote(absl::StrJoin(item.values, " "));
}

// __radixkvctl_values CMD FLAG and __radixkvctl_args CMD.
std::string BashValues(const CompletionModel& m) {
  std::string values =
      "\n# Completes the value of flag $2 of command $1.\n"
      "__radixkvctl_values() {\n  case \"$1 $2\" in\n";
  // `command` empty: a global flag, valid with any command.
  auto add = [&](const std::string& command, const CompletionItem& f) {
    if (!f.takes_value || (f.values.empty() && !f.paths)) return;
    std::vector<std::string> patterns;
    for (const std::string& n : f.names) {
      patterns.push_back(command.empty() ? "*" + ShellQuote(" " + n)
                                         : ShellQuote(command + " " + n));
    }
    absl::StrAppend(&values, "    ", absl::StrJoin(patterns, "|"), ") ",
                    BashReply(f), " ;;\n");
  };
  for (const CompletionItem& f : m.globals) add("", f);
  for (const CompletionCommand& c : m.commands) {
    for (const CompletionItem& f : c.flags) add(c.name, f);
  }
  absl::StrAppend(&values, "  esac\n}\n");

  CompletionItem command;
  for (const CompletionCommand& c : m.commands) {
    command.values.push_back(c.name);
  }
  std::string args = absl::StrCat(
      "\n# Completes an argument of command $1 (none: the command name).\n"
      "__radixkvctl_args() {\n  case $1 in\n    '') ",
      BashReply(command), " ;;\n");
  for (const CompletionCommand& c : m.commands) {
    for (const CompletionItem& p : c.positionals) {
      if (p.values.empty() && !p.paths) continue;
      absl::StrAppend(&args, "    ", c.name, ") ", BashReply(p), " ;;\n");
    }
  }
  absl::StrAppend(&args, "  esac\n}\n");
  return values + args;
}

constexpr char kZshHead[] =
    R"sh(#compdef radixkvctl
# zsh completion for radixkvctl (`radixkvctl completion zsh`).
# Load it in this shell (after compinit):  source <(radixkvctl completion zsh)
# or in every shell: save it as _radixkvctl in a directory of $fpath.

_radixkvctl() {
  local -a globals commands
)sh";

constexpr char kZshMain[] = R"sh(  local curcontext=$curcontext ret=1
  local context state state_descr line
  typeset -A opt_args
  _arguments -C $globals '1: :->command' '*:: :->args' && ret=0
  case $state in
    command)
      _describe -t commands 'radixkvctl command' commands && ret=0
      ;;
    args)
      curcontext=${curcontext%:*:*}:radixkvctl-$words[1]:
      case $words[1] in
)sh";

constexpr char kZshTail[] = R"sh(      esac
      ;;
  esac
  return ret
}

if [[ $funcstack[1] == _radixkvctl ]]; then
  _radixkvctl "$@"
else
  compdef _radixkvctl radixkvctl
fi
)sh";

// The _arguments action for the value of `item`: _files, (words), or " "
// (nothing to offer).
std::string ZshAction(const CompletionItem& item) {
  if (item.paths) return "_files";
  if (item.values.empty()) return " ";
  return absl::StrCat("(", absl::StrJoin(item.values, " "), ")");
}

// The _arguments specs of a flag, one per name, each quoted.
std::vector<std::string> ZshFlagSpecs(const CompletionItem& f) {
  const std::string help = absl::StrReplaceAll(
      f.help, {{"\\", "\\\\"}, {"[", "\\["}, {"]", "\\]"}});
  std::vector<std::string> specs;
  for (const std::string& n : f.names) {
    std::string spec = n;
    if (f.takes_value) spec += absl::StartsWith(n, "--") ? "=" : "+";
    absl::StrAppend(&spec, "[", help, "]");
    if (f.takes_value) absl::StrAppend(&spec, ":value:", ZshAction(f));
    specs.push_back(ShellQuote(spec));
  }
  return specs;
}

// `s` single-quoted for fish, where a backslash escapes only a quote or a
// backslash inside single quotes: 'it\'s'.
std::string FishQuote(absl::string_view s) {
  return absl::StrCat(
      "'", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"'", "\\'"}}), "'");
}

constexpr char kFishHead[] =
    R"sh(# fish completion for radixkvctl (`radixkvctl completion fish`).
# Load it in this shell:  radixkvctl completion fish | source
# or in every shell: save it as ~/.config/fish/completions/radixkvctl.fish
# (or /usr/share/fish/vendor_completions.d/radixkvctl.fish).

complete -c radixkvctl -e
# File names only where a flag or argument takes them.
complete -c radixkvctl -f
)sh";

// The `complete` options of a flag's names and value: "-s o -l output -x -a
// 'text json'".
std::string FishFlag(const CompletionItem& f) {
  std::vector<std::string> parts;
  for (const std::string& n : f.names) {
    if (absl::StartsWith(n, "--")) {
      parts.push_back("-l " + FishQuote(n.substr(2)));
    } else if (absl::StartsWith(n, "-")) {
      parts.push_back("-s " + FishQuote(n.substr(1)));
    }
  }
  if (f.takes_value) {
    if (f.paths) {
      parts.push_back("-r -F");
    } else {
      parts.push_back("-x");
      if (!f.values.empty()) {
        parts.push_back("-a " + FishQuote(absl::StrJoin(f.values, " ")));
      }
    }
  }
  if (!f.help.empty()) parts.push_back("-d " + FishQuote(f.help));
  return absl::StrJoin(parts, " ");
}

}  // namespace

std::string FishCompletion(const CompletionModel& m) {
  std::vector<std::string> names;
  for (const CompletionCommand& c : m.commands) names.push_back(c.name);
  const std::string all = absl::StrJoin(names, " ");
  std::string out = kFishHead;
  absl::StrAppend(&out, "\n# Commands, until one is given.\n");
  for (const CompletionCommand& c : m.commands) {
    absl::StrAppend(&out, "complete -c radixkvctl -n ",
                    FishQuote("not __fish_seen_subcommand_from " + all),
                    " -a ", FishQuote(c.name), " -d ", FishQuote(c.summary),
                    "\n");
  }
  absl::StrAppend(&out, "\n# Global flags, before or after the command.\n");
  for (const CompletionItem& f : m.globals) {
    absl::StrAppend(&out, "complete -c radixkvctl ", FishFlag(f), "\n");
  }
  for (const CompletionCommand& c : m.commands) {
    if (c.flags.empty() && c.positionals.empty()) continue;
    const std::string when =
        FishQuote("__fish_seen_subcommand_from " + c.name);
    absl::StrAppend(&out, "\n# ", c.name, "\n");
    for (const CompletionItem& f : c.flags) {
      absl::StrAppend(&out, "complete -c radixkvctl -n ", when, " ",
                      FishFlag(f), "\n");
    }
    for (const CompletionItem& p : c.positionals) {
      if (p.paths) {
        absl::StrAppend(&out, "complete -c radixkvctl -n ", when, " -F\n");
      } else if (!p.values.empty()) {
        absl::StrAppend(&out, "complete -c radixkvctl -n ", when, " -a ",
                        FishQuote(absl::StrJoin(p.values, " ")), "\n");
      }
    }
  }
  return out;
}

std::string BashCompletion(const CompletionModel& m) {
  return absl::StrCat(
      kBashHead,
      BashCase(m, "__radixkvctl_flags",
               "The flags of command $1 and the global flags (\"--name=\": "
               "takes a value).",
               BashFlagWords, true),
      BashCase(m, "__radixkvctl_value_flags",
               "The flags of command $1 and the global flags that take a "
               "value.",
               BashValueFlags, true),
      BashValues(m), kBashMain);
}

std::string ZshCompletion(const CompletionModel& m) {
  std::string out = absl::StrCat(kZshHead, "  globals=(\n");
  for (const CompletionItem& f : m.globals) {
    for (const std::string& s : ZshFlagSpecs(f)) {
      absl::StrAppend(&out, "    ", s, "\n");
    }
  }
  absl::StrAppend(&out, "  )\n  commands=(\n");
  for (const CompletionCommand& c : m.commands) {
    absl::StrAppend(&out, "    ", ShellQuote(c.name + ":" + c.summary), "\n");
  }
  absl::StrAppend(&out, "  )\n", kZshMain);
  for (const CompletionCommand& c : m.commands) {
    std::vector<std::string> specs = {"$globals"};
    for (const CompletionItem& f : c.flags) {
      for (std::string& s : ZshFlagSpecs(f)) specs.push_back(std::move(s));
    }
    for (const CompletionItem& p : c.positionals) {
      specs.push_back(ShellQuote(absl::StrCat(
          "*:", absl::StrReplaceAll(p.names[0], {{":", "\\:"}}), ":",
          ZshAction(p))));
    }
    absl::StrAppend(&out, "        ", c.name, ")\n          _arguments ",
                    absl::StrJoin(specs, " \\\n            "),
                    " && ret=0\n          ;;\n");
  }
  return out + kZshTail;
}

}  // namespace radixkv::ctl
