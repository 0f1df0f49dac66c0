// GPT-2's pre-tokenizer: cuts text into the pieces that BPE then encodes one at a time, exactly as
// the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does when it is run with leftmost-first alternation (tiktoken's fancy-regex, Python's regex),
// written out by hand so that no regex engine is needed and encoding stays fast.
//
// Semantics kept from the pattern: the contractions are lower-case ASCII only ("'S" is not one);
// the optional leading character is U+0020 alone; a white-space run followed by a non-space gives
// its last white-space character to the next piece (so " \n  x" is " \n ", " x"), and a run of
// one such character stays a piece of its own. \p{L} and \p{N} are Unicode's general categories
// L* and N*, \s is the White_Space property (both from ICU). A byte that does not start a well-formed
// UTF-8 sequence is one character of no category, so any byte string splits and the pieces
// concatenate back to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weft {

enum class Gpt2CharacterClass : uint8_t {
  kLetter,  // \p{L}
  kNumber,  // \p{N}
  kSpace,   // \s
  kOther,   // everything else, and bytes that are not well-formed UTF-8
};

struct Gpt2Character {
  int length;  // bytes, 1 to 4
  Gpt2CharacterClass character_class;
};

// The character starting at text[position] (position < text.size()).
Gpt2Character gpt2_character_at(std::string_view text, size_t position);

// The end of the piece that starts at text[start] (start < text.size()); the next piece starts there.
size_t gpt2_piece_end(std::string_view text, size_t start);

}  // namespace weft
