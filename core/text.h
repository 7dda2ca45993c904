// Text helpers shared by the writers of HTML and XML reports.
#pragma once

#include <string>

namespace dflash {

// &, <, >, " escaped for HTML/XML text and attribute values.
inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

}  // namespace dflash
