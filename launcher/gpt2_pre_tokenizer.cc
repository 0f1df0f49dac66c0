#include "launcher/gpt2_pre_tokenizer.h"

#include <array>
#include <unicode/uchar.h>

namespace weft {
namespace {

Gpt2CharacterClass class_of_code_point(UChar32 code_point) {
  if (u_isUWhiteSpace(code_point)) return Gpt2CharacterClass::kSpace;
  switch (u_charType(code_point)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return Gpt2CharacterClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return Gpt2CharacterClass::kNumber;
    default:
      return Gpt2CharacterClass::kOther;
  }
}

// Most text is ASCII: its classes come from a table built once from ICU, not from a call per byte.
const std::array<Gpt2CharacterClass, 128>& ascii_classes() {
  static const std::array<Gpt2CharacterClass, 128> table = [] {
    std::array<Gpt2CharacterClass, 128> classes{};
    for (int byte = 0; byte < 128; ++byte) classes[byte] = class_of_code_point(byte);
    return classes;
  }();
  return table;
}

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

}  // namespace

Gpt2Character gpt2_character_at(std::string_view text, size_t position) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + position;
  const size_t left = text.size() - position;
  const unsigned char lead = bytes[0];
  if (lead < 0x80) return {1, ascii_classes()[lead]};
  // Well-formed sequences (Unicode table 3-7): the second byte's range depends on the lead so that
  // overlong forms, surrogates and code points above U+10FFFF are rejected.
  int length = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
  UChar32 code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  } else {
    return {1, Gpt2CharacterClass::kOther};
  }
  if (left < static_cast<size_t>(length) || bytes[1] < second_low || bytes[1] > second_high) {
    return {1, Gpt2CharacterClass::kOther};
  }
  for (int i = 1; i < length; ++i) {
    if (!is_continuation(bytes[i])) return {1, Gpt2CharacterClass::kOther};
    code_point = (code_point << 6) | (bytes[i] & 0x3F);
  }
  return {length, class_of_code_point(code_point)};
}

size_t gpt2_piece_end(std::string_view text, size_t start) {
  const size_t size = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d
  if (text[start] == '\'' && start + 1 < size) {
    const char next = text[start + 1];
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return start + 2;
    if (start + 2 < size) {
      const std::string_view two = text.substr(start + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") return start + 3;
    }
  }
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
  const Gpt2Character first = gpt2_character_at(text, start);
  size_t run_start = start;
  Gpt2CharacterClass run_class = first.character_class;
  if (text[start] == ' ' && start + 1 < size) {
    const Gpt2Character second = gpt2_character_at(text, start + 1);
    if (second.character_class != Gpt2CharacterClass::kSpace) {
      run_start = start + 1;
      run_class = second.character_class;
    }
  }
  if (run_class != Gpt2CharacterClass::kSpace) {
    size_t position = run_start;
    while (position < size) {
      const Gpt2Character character = gpt2_character_at(text, position);
      if (character.character_class != run_class) break;
      position += character.length;
    }
    return position;
  }
  // `\s+(?!\S)|\s+`: the whole white-space run when it ends the text; otherwise the run less its
  // last character, unless that would leave nothing (then the one character alone).
  size_t position = start;
  size_t last_start = start;
  while (position < size) {
    const Gpt2Character character = gpt2_character_at(text, position);
    if (character.character_class != Gpt2CharacterClass::kSpace) break;
    last_start = position;
    position += character.length;
  }
  if (position == size || last_start == start) return position;
  return last_start;
}

}  // namespace weft
